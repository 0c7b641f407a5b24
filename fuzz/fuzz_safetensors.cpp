// The safetensors reader: header length, JSON header, dtypes, shapes, offsets; then the first and
// last byte of every tensor is read (out-of-bounds offsets would show under ASan).
#include "fuzz_util.hpp"
#include "kvarn/runner/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvarn::fuzz::write_scratch("model.safetensors", data, size);
  kvarn::fuzz::expect_clean([&] {
    const kvarn::SafetensorsFile file(path);
    volatile unsigned sum = 0;
    for (const kvarn::StTensorInfo& t : file.tensors()) {
      if (t.end == t.begin) continue;
      const std::uint8_t* p = file.data(t);
      sum = sum + p[0] + p[t.end - t.begin - 1];
    }
  });
  return 0;
}
