// The attention kernel built for AVX512 (kernels/cpu/attention_impl.h; dispatch in
// attention.cpp). Same bits as the other paths: only the vector width differs.
#define LINNET_ATTENTION_NS avx512_path
#include "kernels/cpu/attention_impl.h"
