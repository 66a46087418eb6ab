"""What the frame compiler (dcf/frame_compiler.py) fuses in the loops and roots it compiles
for GPU partitions, one module per pattern. Each module finds its pattern in a frame's
nodes where the graph proves the fused call sees everything the ops one by one would
(single consumers, the same GPU, no control edges), and gives the callable the generated
code calls; anything the fast path does not take runs the ops one by one.

- `elementwise`: trees of elementwise ops as one raw kernel;
- `accumulate`: a loop's gradient sum `acc + MatMul` / `acc + Sum(axis 0)` in place;
- `gates_grad`: the AddN making an LSTM layer's output gradient, inside LSTMGatesGrad;
- `matmul_gates`: an LSTM step's gates writing their activations over the product z;
- `split_matmul`: the one read part of a split of `g @ W^T`, as a GEMM on W's rows;
- `slice_add`: a slice's gradient added into the other addend's slice, not padded;

and `patterns`, what their pattern finders share.
"""
