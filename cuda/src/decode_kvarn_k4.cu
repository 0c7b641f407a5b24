#include "decode_launch.cuh"

namespace kvarn::cuda::detail {

bool launch_kvarn_k4(int kb, int vb, const DecodeArgs& a, const LaunchShape& s, cudaStream_t st) {
  if (kb == 4 && vb == 2) {
    launch_decode<KvFormat::kKvarn, 4, 2>(a, s, st);
  } else if (kb == 4 && vb == 4) {
    launch_decode<KvFormat::kKvarn, 4, 4>(a, s, st);
  } else {
    return false;
  }
  return true;
}

}  // namespace kvarn::cuda::detail
