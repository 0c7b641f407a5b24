#include "decode_launch.cuh"

namespace kvarn::cuda::detail {

void launch_fp(KvFormat f, const DecodeArgs& a, const LaunchShape& s, cudaStream_t st) {
  if (f == KvFormat::kFp16) {
    launch_decode<KvFormat::kFp16, 8, 8>(a, s, st);
  } else {
    launch_decode<KvFormat::kFp8, 8, 8>(a, s, st);
  }
}

}  // namespace kvarn::cuda::detail
