// A debugging aid: logs every C++ exception a process throws (type and what(), and with
// THROWLOG_STACK set the native frames that threw) to the file named by $THROWLOG
// (default /tmp/throws.log), then throws it as usual. pytest captures fd 2, so it
// writes a file. (Used on the suite's late-worker crash of 2026-12-07, which turned out
// to be the worker's memory mappings reaching vm.max_map_count: tests/conftest.py.)
//
//   g++ -O1 -shared -fPIC -o /tmp/throwlog.so scripts/throwlog.cc -ldl
//   LD_PRELOAD=/tmp/throwlog.so bash .ci/run
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <typeinfo>

extern "C" {
typedef void (*throw_fn)(void*, std::type_info*, void (*)(void*));

[[noreturn]] void __cxa_throw(void* obj, std::type_info* tinfo, void (*dest)(void*)) {
  static throw_fn real = (throw_fn)dlsym(RTLD_NEXT, "__cxa_throw");
  const char* path = getenv("THROWLOG") ? getenv("THROWLOG") : "/tmp/throws.log";
  const char* name = tinfo ? tinfo->name() : "?";
  if (FILE* f = fopen(path, "a")) {
    // the types that derive from std::exception here all name themselves *Error*
    if (strstr(name, "Error") || strstr(name, "error") || strstr(name, "exception")) {
      fprintf(f, "[pid %d] %s: %.800s\n", getpid(), name,
              static_cast<const std::exception*>(obj)->what());
    } else {
      fprintf(f, "[pid %d] %s\n", getpid(), name);
    }
    if (getenv("THROWLOG_STACK")) {  // the native frames that threw (set it to look)
      void* frames[24];
      int n = backtrace(frames, 24);
      fflush(f);
      backtrace_symbols_fd(frames, n, fileno(f));
    }
    fclose(f);
  }
  real(obj, tinfo, dest);
  __builtin_unreachable();
}
}
