/* gpu_runtime: the one place that names the vendor runtime. CUDA by default; -DZAYA_HIP maps the same names onto
 * HIP (ROCm), hipBLASLt and RCCL, so an AMD MI300X build is a build flag away (docs/gpus.md). Only what both
 * runtimes provide is used: no cooperative groups beyond warp shuffles (the one grid barrier, gk_grid_sync, is
 * written out), no inline PTX, no texture objects. */
#ifndef ZAYA_GPU_RUNTIME_H
#define ZAYA_GPU_RUNTIME_H

#if defined(ZAYA_HIP) && !defined(ZAYA_GPU_EMU) /* the emulator speaks CUDA's runtime names, a HIP form's kernels too */
#include <hip/hip_runtime.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#define ZAYA_HIP_BF16 __hip_bfloat16
#else /* ROCm before 5.7 (Debian 12 packages 5.2, enough to compile-check the kernels): the older bf16 class */
#include <hip/hip_bfloat16.h>
#define ZAYA_HIP_BF16 hip_bfloat16
#endif
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuErrorNoDevice hipErrorNoDevice
#define gpuErrorInsufficientDriver hipErrorInsufficientDriver
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuStream_t hipStream_t
#define gpuEvent_t hipEvent_t
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpy hipMemcpy
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemset hipMemset
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStreamCreate hipStreamCreate
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDevice hipGetDevice
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuDeviceProp hipDeviceProp_t
#define gpuEventCreate hipEventCreate
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuEventDestroy hipEventDestroy
#define gpuMemGetInfo hipMemGetInfo
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuFuncSetAttribute hipFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphNode_t hipGraphNode_t
#define gpuGraphGetNodes hipGraphGetNodes
#define gpuGraphNodeGetType hipGraphNodeGetType
#define gpuGraphNodeType hipGraphNodeType
#define gpuGraphNodeTypeKernel hipGraphNodeTypeKernel
typedef ZAYA_HIP_BF16 gpu_bf16;
#define GPU_WARP 64 /* AMD wavefront */
#else
#ifdef ZAYA_GPU_EMU /* tests/gpu/emu: the CUDA runtime's host side on the CPU (cuda_emu.h sets the warp) */
#include "cuda_runtime_api.h"
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
typedef __nv_bfloat16 gpu_bf16;
#define GPU_WARP 32
#endif
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuErrorNoDevice cudaErrorNoDevice
#define gpuErrorInsufficientDriver cudaErrorInsufficientDriver
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuStream_t cudaStream_t
#define gpuEvent_t cudaEvent_t
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpy cudaMemcpy
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemset cudaMemset
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStreamCreate cudaStreamCreate
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDevice cudaGetDevice
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuDeviceProp cudaDeviceProp
#define gpuEventCreate cudaEventCreate
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventDestroy cudaEventDestroy
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphNode_t cudaGraphNode_t
#define gpuGraphGetNodes cudaGraphGetNodes
#define gpuGraphNodeGetType cudaGraphNodeGetType
#define gpuGraphNodeType cudaGraphNodeType
#define gpuGraphNodeTypeKernel cudaGraphNodeTypeKernel
#endif

#endif
