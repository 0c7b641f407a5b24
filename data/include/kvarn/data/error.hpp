// Error reporting shared by every kvarn library.
//
// Library code throws kvarn::Error with a message that names the place (file, dataset, index,
// key, line:column). Only the CLI turns an Error into a message and an exit code; no library
// calls exit(). KVARN_CHECK is for invariants on user-controlled input: it is never compiled out.
#ifndef KVARN_DATA_ERROR_HPP_
#define KVARN_DATA_ERROR_HPP_

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvarn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, T&& first, Rest&&... rest) {
  os << std::forward<T>(first);
  append_all(os, std::forward<Rest>(rest)...);
}
}  // namespace detail

// Builds a message from its arguments (streamed) and throws kvarn::Error.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  detail::append_all(os, std::forward<Args>(args)...);
  throw Error(os.str());
}

}  // namespace kvarn

#define KVARN_CHECK(cond, ...)   \
  do {                           \
    if (!(cond)) {               \
      ::kvarn::fail(__VA_ARGS__); \
    }                            \
  } while (false)

#endif  // KVARN_DATA_ERROR_HPP_
