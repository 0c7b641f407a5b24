// A std::vector whose resize leaves new elements of a trivial type uninitialized, for buffers
// that are written in full before they are read (a megabyte-sized zero-fill per slab otherwise).
#ifndef KVARN_DATA_UNINIT_VECTOR_HPP_
#define KVARN_DATA_UNINIT_VECTOR_HPP_

#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace kvarn {

// std::allocator, except that value-initialization (resize(n), vector(n)) default-initializes.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}  // NOLINT: allocator rebind

  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
};

template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace kvarn

#endif  // KVARN_DATA_UNINIT_VECTOR_HPP_
