// The attention kernel built for AVX2 (kernels/cpu/attention_impl.h; dispatch in
// attention.cpp). Same bits as the other paths: only the vector width differs.
#define LINNET_ATTENTION_NS avx2_path
#include "kernels/cpu/attention_impl.h"
