/* The test suite's processes keep the unwind tables of XLA's JIT-compiled code away from
 * libgcc (tests/jit_frames.py loads this first, RTLD_GLOBAL, so jaxlib's calls land
 * here). Why: a worker that has run thousands of programs holds ~11k registered frame
 * objects, and late in a long run a C++ exception thrown inside jaxlib crashed in
 * libgcc 12's search of them (_Unwind_Find_FDE; its signal handler then deadlocked on
 * the unwinder's object lock, which only that search takes). Nothing unwinds through
 * XLA's generated code: its callbacks and handlers return errors, never throw. */
static long skipped;

void __register_frame(void *begin) {
  (void)begin;
  __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED);
}

void __deregister_frame(void *begin) { (void)begin; }

long radixjax_skipped_jit_frames(void) { return __atomic_load_n(&skipped, __ATOMIC_RELAXED); }
