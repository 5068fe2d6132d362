"""The fence gate on MLX's CUDA backend: kernels (mx.fast.cuda_kernel) and the control page's advice."""
