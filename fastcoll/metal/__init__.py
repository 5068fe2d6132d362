"""The fence gate on MLX's Metal backend: kernels (mx.fast.metal_kernel) beside the CUDA ones."""
