// Internal: each method family registers itself here (explicit calls, no static-init magic, so a
// static library never drops a family).
#ifndef KVARN_CORE_SRC_FAMILIES_HPP_
#define KVARN_CORE_SRC_FAMILIES_HPP_

#include "kvarn/core/registry.hpp"

namespace kvarn {
void register_fp16(Registry& r);
void register_kvarn(Registry& r);
void register_fp8(Registry& r);
void register_kivi(Registry& r);
void register_quarot(Registry& r);
void register_turboquant(Registry& r);
}  // namespace kvarn

#endif  // KVARN_CORE_SRC_FAMILIES_HPP_
