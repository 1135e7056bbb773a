"""The CUDA side: a small driver-API layer over cuda-python (no runtime, NVRTC, cuBLAS or torch),
the kernel table, weight upload, and the GPU runner. Nothing here is imported without a GPU path."""
