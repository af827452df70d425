# Every target that exists only under --config=cuda (sourced by test.sh and
# gpu_bundle.sh, so the two lists cannot drift apart).
CUDA_TARGETS=(//kernels/cuda/... //worker/model:cuda_backend //worker/model:cuda_backend_test
  //worker/model:nccl_device_channel //worker/model:nccl_device_channel_test
  //worker/model:nccl_device_collective //worker/model:nccl_device_collective_test
  //worker/model:backend_select_test //worker/train:local_trainer_cuda_test
  //worker/runtime:pipeline_cuda_test //worker/profile:unit_profiler_cuda_test
  //worker/collectives:tensor_parallel_cuda_test)
