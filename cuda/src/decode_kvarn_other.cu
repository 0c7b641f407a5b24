#include "decode_launch.cuh"

namespace kvarn::cuda::detail {

bool launch_kvarn_other(int kb, int vb, const DecodeArgs& a, const LaunchShape& s,
                        cudaStream_t st) {
  if (kb == 2 && vb == 2) {
    launch_decode<KvFormat::kKvarn, 2, 2>(a, s, st);
  } else if (kb == 8 && vb == 8) {
    launch_decode<KvFormat::kKvarn, 8, 8>(a, s, st);
  } else if (kb == 3 && vb == 2) {
    launch_decode<KvFormat::kKvarn, 3, 2>(a, s, st);
  } else {
    return false;
  }
  return true;
}

}  // namespace kvarn::cuda::detail
