# NCCL (issue 31): tensor parallelism's all-reduce across GPUs (src/backends/cuda/cuda_comm.cu,
# linked into anna_cuda when found; without it --tensor-parallel uses the host transport).
# Looked for with pkg-config (Debian's libnccl-dev), then as a plain library beside the
# CUDA toolkit, then in PyPI's nvidia-nccl-cu12 wheel (site-packages/nvidia/nccl/{lib,include},
# which ships only libnccl.so.2; python3's, or the ~/.cache/anna/venvs ones): how the GPU machines have it. Sets ANNA_NCCL_FOUND,
# ANNA_NCCL_LIBRARY and ANNA_NCCL_INCLUDE_DIR and reports on/off.
set(ANNA_NCCL_FOUND OFF)
pkg_check_modules(NCCL QUIET nccl)
if(NCCL_FOUND)
  set(ANNA_NCCL_FOUND ON)
  set(ANNA_NCCL_LIBRARY "${NCCL_LINK_LIBRARIES}")
  set(ANNA_NCCL_INCLUDE_DIR "${NCCL_INCLUDE_DIRS}")
else()
  set(_nccl_hints "")
  if(CUDAToolkit_LIBRARY_DIR)
    list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_DIR}")
  endif()
  find_program(_anna_python3 python3)
  if(_anna_python3)
    execute_process(
      COMMAND "${_anna_python3}" -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])"
      OUTPUT_VARIABLE _nccl_py RESULT_VARIABLE _nccl_py_rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_nccl_py_rc EQUAL 0 AND _nccl_py)
      list(APPEND _nccl_hints "${_nccl_py}/lib")
      set(_nccl_inc_hint "${_nccl_py}/include")
    endif()
  endif()
  # the reference venvs of scripts/setup.sh carry the wheel (PyTorch's dependency)
  file(GLOB _nccl_venvs "$ENV{HOME}/.cache/anna/venvs/*/lib/python3*/site-packages/nvidia/nccl")
  foreach(_v ${_nccl_venvs})
    list(APPEND _nccl_hints "${_v}/lib")
    list(APPEND _nccl_inc_hint "${_v}/include")
  endforeach()
  find_library(ANNA_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints})
  find_path(ANNA_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_inc_hint} ${CUDAToolkit_INCLUDE_DIRS})
  if(ANNA_NCCL_LIBRARY AND ANNA_NCCL_INCLUDE_DIR)
    set(ANNA_NCCL_FOUND ON)
  endif()
endif()
if(ANNA_NCCL_FOUND)
  message(STATUS "anna: NCCL: on (${ANNA_NCCL_LIBRARY}; --tensor-parallel all-reduce)")
else()
  message(STATUS "anna: NCCL: off (no libnccl-dev and no nvidia-nccl-cu12 wheel found; --tensor-parallel uses the host all-reduce)")
endif()
