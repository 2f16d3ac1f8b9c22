/* CUDA probe: a C interface to the CUDA runtime, cuBLAS and NCCL, compiled by nvcc only when
   the CUDA backend is built. Safe without a GPU: nothing but version queries runs then. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int devices;         /* usable GPUs; 0 when cudaGetDeviceCount fails */
  int runtime_version; /* cudaRuntimeGetVersion */
  int driver_version;  /* cudaDriverGetVersion; 0 = no driver */
  int nccl_version;    /* ncclGetVersion */
  char error[160];     /* why there is no device, empty otherwise */
} ap_cuda_probe_result;

void ap_cuda_probe(ap_cuda_probe_result* out);
/* Writes "" on success, else the failure (including "no usable GPU"). */
void ap_cuda_self_test(char* msg, int capacity);

#ifdef __cplusplus
}
#endif
