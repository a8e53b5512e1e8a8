"""CUDA kernels run on the CPU: each `k<<<grid, block>>>(args)` becomes a loop over the
launch grid (g++ and a small shim for threadIdx/blockIdx/dim3/float4).

Threads run one after another, which is exact for kernels that share no memory and
never synchronise. A kernel that calls `__syncthreads` or `__shfl_down_sync` runs in
lockstep instead: each thread of a block is a fiber (its own stack), and every barrier or
shuffle parks it until every other live thread of the block has reached its own next one.
That is a block-wide barrier, exact for the barriers all threads reach and for shuffles
in a branch only one warp takes, as long as no other thread waits at a barrier meanwhile.
`__shared__` arrays are `static`: one copy, fine while blocks run one after another."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from htam_engine import parsing
from htam_engine.parsing import cxx_source
from htam_engine.strategies.base import apply_edits

SHIM = """\
#undef _FORTIFY_SOURCE
#include <math.h>
#include <setjmp.h>
#include <ucontext.h>
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
static dim3 threadIdx, blockIdx, blockDim, gridDim;
struct alignas(16) float4 { float x, y, z, w; };
#define __global__
#define __shared__ static
#define __launch_bounds__(...)
static void htam_thread(unsigned t) {
    threadIdx = dim3(t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y));
}
#ifndef HTAM_LOCKSTEP
template <class F> static void htam_block(unsigned threads, F &body) {
    for (unsigned t = 0; t < threads; ++t) {
        htam_thread(t);
        body();
    }
}
#else
struct htam_fiber { jmp_buf resume; ucontext_t start; bool started, done; };
static const unsigned HTAM_STACK = 1u << 16;
static htam_fiber *htam_fibers;
static unsigned htam_current;
static jmp_buf htam_scheduler;
static void (*htam_run)(void *);
static void *htam_body;
static void __syncthreads() {
    if (!_setjmp(htam_fibers[htam_current].resume)) _longjmp(htam_scheduler, 1);
}
static float htam_lanes[1024];
static float __shfl_down_sync(unsigned, float value, unsigned delta) {
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    htam_lanes[t] = value;
    __syncthreads();
    float moved = t % 32 + delta < 32 ? htam_lanes[t + delta] : value;
    __syncthreads();
    return moved;
}
static void htam_entry() {
    htam_run(htam_body);
    htam_fibers[htam_current].done = true;
    _longjmp(htam_scheduler, 1);
}
template <class F> static void htam_call(void *body) { (*static_cast<F *>(body))(); }
static void htam_step(unsigned t, char *stack) {
    htam_fiber &fiber = htam_fibers[t];
    htam_current = t;
    htam_thread(t);
    if (_setjmp(htam_scheduler)) return;
    if (fiber.started) _longjmp(fiber.resume, 1);
    fiber.started = true;
    getcontext(&fiber.start);
    fiber.start.uc_stack.ss_sp = stack;
    fiber.start.uc_stack.ss_size = HTAM_STACK;
    fiber.start.uc_link = nullptr;
    makecontext(&fiber.start, htam_entry, 0);
    setcontext(&fiber.start);
}
template <class F> static void htam_block(unsigned threads, F &body) {
    static char stacks[1024][HTAM_STACK];
    static htam_fiber fibers[1024];
    for (unsigned t = 0; t < threads; ++t) fibers[t].started = fibers[t].done = false;
    htam_fibers = fibers;
    htam_run = htam_call<F>;
    htam_body = &body;
    for (bool live = true; live;) {
        live = false;
        for (unsigned t = 0; t < threads; ++t) {
            if (fibers[t].done) continue;
            htam_step(t, stacks[t]);
            live = live || !fibers[t].done;
        }
    }
}
#endif
template <class F> static void htam_launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = dim3(x, y, z);
                htam_block(block.x * block.y * block.z, body);
            }
}
"""
LOCKSTEP = ("__syncthreads", "__shfl_down_sync")


def emulated(kernel_source: str) -> str:
    """The kernel source with each `k<<<g, b>>>(args)` turned into a loop over the grid."""
    data = kernel_source.encode()
    edits = []
    for call in cxx_source.launches(parsing.parse(data, "cuda").root_node):
        grid, block = (parsing.text(n) for n in cxx_source.launch_config(call)[:2])
        name = parsing.text(call.child_by_field_name("function"))
        args = parsing.text(call.child_by_field_name("arguments"))
        launch = f"htam_launch({grid}, {block}, [&] {{ {name}{args}; }})"
        edits.append((call.start_byte, call.end_byte, launch))
    body = apply_edits(data, edits).decode()
    lockstep = "#define HTAM_LOCKSTEP\n" if any(word in body for word in LOCKSTEP) else ""
    return f'{lockstep}{SHIM}extern "C" {{\n{body}\n}}\n'


def launcher(lib: ctypes.CDLL, source: str) -> Callable[..., None]:
    """The host function of `source` that launches its kernel, typed from its parameters."""
    (host,) = [u for u in parsing.kernels(source, "cuda") if u.kind == "host"]
    root = parsing.parse(source, "cuda").root_node
    fn = next(f for f in cxx_source.functions(root) if cxx_source.function_name(f) == host.name)
    launch = getattr(lib, host.name)
    launch.argtypes = [
        ctypes.c_void_p if cxx_source.pointer_declarator(p) else ctypes.c_int
        for p in cxx_source.parameters(fn)
    ]
    return launch
