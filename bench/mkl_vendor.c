/* MKL's vendor emulation for bench/toy_numerics.sh and bench/toy_verdict_numerics.sh (issues 36, 44).
 *
 * torch's wheel links MKL statically but calls MKL's vendor queries through its PLT, so an
 * LD_PRELOAD library built from this file answers them: mkl_serv_intel_cpu_true says "not Intel",
 * and, built with -DZEN, mkl_serv_cpuiszen does what MKL's own does (disassembled from
 * libtorch_cpu.so): "Zen" only when MKL's CNR branch is OFF or AUTO. MKL's CPUID-based feature
 * checks still see this CPU, and nothing else of another CPU is emulated (torch's and glibc's kernel
 * choice by CPU features, cache sizes).
 *
 *   cc -shared -fPIC -O2 -o non-intel.so bench/mkl_vendor.c -ldl
 *   cc -shared -fPIC -O2 -DZEN -o zen.so bench/mkl_vendor.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#ifdef ZEN
int mkl_serv_cpuiszen(void) {
  static int (*branch)(int);
  if (!branch) branch = (int (*)(int))dlsym(dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD), "mkl_serv_cbwr_get");
  int b = branch(1);
  return b == 1 || b == 2;
}
#endif
int mkl_serv_intel_cpu_true(void) { return 0; }
int mkl_serv_intel_cpu(void) { return 0; }
