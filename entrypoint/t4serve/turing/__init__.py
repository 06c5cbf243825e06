"""vLLM's Triton attention on Turing's tensor cores: the lowering of Triton's sm_80 code to sm_75, the launch table,
the vLLM plugin that installs them, and their proof.

Triton >= 3.3 has no tensor-core path below compute capability 8.0, so on a T4 vLLM's attention runs its dot products
on CUDA cores. t4serve has Triton generate vLLM's own kernel with its sm_80 code generator at one pipeline stage and
lowers the one instruction Turing lacks (`lowering`, applied by `hook` inside Triton's compile), launches it as
`launch`'s table says, installs both in vLLM's processes through `plugin` (T4SERVE_ATTENTION=turing-mma), and proves
every launch at image build (`proof`, its child `worker`). Nothing here imports torch or vLLM at module import.
"""
