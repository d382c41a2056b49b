#!/usr/bin/env bash
# Prints the OpenBLAS kernel family the test suite pins (OPENBLAS_CORETYPE), or nothing.
# Why: OpenBLAS picks its kernels from the CPU model at load time, and on virtual machines that
# report a generic "Intel(R) Xeon(R) Processor" it falls back to Prescott (SSE3) even where AVX-512
# is there. Other kernels round sums differently, and a few V4.1 golden sequences cascade through
# the QAT steps on a last-bit difference (tests/cpp/model_v41/parity.h), so the tests pin the
# family from the CPU's flags: SkylakeX with AVX-512, Haswell with AVX2. An OPENBLAS_CORETYPE
# already set wins.
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then echo "$OPENBLAS_CORETYPE"; exit 0; fi
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
case " $flags " in
  *" avx512f "*) echo SkylakeX ;;
  *" avx2 "*) echo Haswell ;;
esac
