// Internal: the body of one instance unit (decode_unit_<unit>.cu defines KVARN_DECODE_UNIT_<unit>
// and includes this): the explicit instantiations of the table rows that name that unit.
#include "decode_launch.cuh"

#ifdef KVARN_DECODE_UNIT_kvarn_k4
#define KVARN_DECODE_IN_kvarn_k4(...) __VA_ARGS__
#else
#define KVARN_DECODE_IN_kvarn_k4(...)
#endif
#ifdef KVARN_DECODE_UNIT_kvarn_other
#define KVARN_DECODE_IN_kvarn_other(...) __VA_ARGS__
#else
#define KVARN_DECODE_IN_kvarn_other(...)
#endif
#ifdef KVARN_DECODE_UNIT_fp
#define KVARN_DECODE_IN_fp(...) __VA_ARGS__
#else
#define KVARN_DECODE_IN_fp(...)
#endif

namespace kvarn::cuda::detail {

#define KVARN_DECODE_INSTANTIATE_(format, kb, vb, unit, warps)                          \
  KVARN_DECODE_IN_##unit(template void launch_decode<KvFormat::format, kb, vb>(       \
      const DecodeArgs&, const LaunchShape&, cudaStream_t);)
KVARN_DECODE_INSTANCES(KVARN_DECODE_INSTANTIATE_)
#undef KVARN_DECODE_INSTANTIATE_

}  // namespace kvarn::cuda::detail
