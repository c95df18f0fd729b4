# Sourced by the scripts that run on the GPU machine (gpu-tests.sh run, gpu-profile.sh): the
# machine's rules and where its tools are.
# - NVLink multicast stays off (a rule of the lent machines).
# - torch's venv (/opt/torch/.venv) first on PATH, when there.
# - DELTACAST_NVRTC_PATH, unless set, to the NVRTC inside that venv, its folder added to
#   LD_LIBRARY_PATH (NVRTC loads its builtins library from there).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
if [ -z "${DELTACAST_NVRTC_PATH:-}" ]; then
    nv=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu*/lib/libnvrtc.so.* 2>/dev/null |
        grep -v builtins | head -1)
    if [ -n "$nv" ]; then
        export DELTACAST_NVRTC_PATH=$nv
        export LD_LIBRARY_PATH=$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
fi
