"""`adaptivespec bench`: AdaptiveSpec side by side with autoregressive decoding and stock vLLM speculation.

One configuration = one vLLM engine, started in a fresh subprocess (`worker`), run over every
(workload, batch, temperature) cell; the parent (`runner`) scores, rewrites the results after each
cell and draws the report (`report`, `plots`).
"""
