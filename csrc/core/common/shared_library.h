// A shared library loaded at run time (dlopen), so that weft builds and runs
// without it, and loaded once per process.
#pragma once

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <utility>

#include "core/common/error.h"

namespace weft {

// An open library, kept loaded for the process's life. Every failure is an
// InvalidArgument that starts with `who` (what wanted it) and ends with
// `remedy` (what to install or set).
class SharedLibrary {
 public:
  SharedLibrary(const std::string& path, std::string who, std::string remedy)
      : path_(path), who_(std::move(who)), remedy_(std::move(remedy)) {
    handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* why = ::dlerror();
      throw InvalidArgument(who_ + ": " + path + " could not be loaded (" +
                            (why ? why : "no reason given") + "); " + remedy_);
    }
  }

  // Points `out` at the library's `symbol`.
  template <typename F>
  void resolve(const char* symbol, F& out) const {
    out = reinterpret_cast<F>(::dlsym(handle_, symbol));
    if (!out) throw InvalidArgument(who_ + ": " + path_ + " has no " + symbol + "; " + remedy_);
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_, who_, remedy_;
  void* handle_ = nullptr;
};

// What `Load` returns, made on the first call; a load that threw
// InvalidArgument throws the same on every call.
template <typename T, T (*Load)()>
const T& loaded_once() {
  static std::once_flag once;
  static T value;
  static std::string failure;
  std::call_once(once, [] {
    try {
      value = Load();
    } catch (const InvalidArgument& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw InvalidArgument(failure);
  return value;
}

}  // namespace weft
