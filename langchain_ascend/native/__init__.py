"""Native CPU kernels (C, compiled on the machine on first use) with a torch fallback.

- ``build``: compiles ``<name>.c`` from this folder once per machine and loads it, where the
  host allows (see its docstring); otherwise reports why and callers keep their torch path.
- ``paged_attention``: the CPU attention backend's attention straight from the paged cache,
  every decode and prefill token as the one-row decode at its position; ``decode_stack``:
  every layer of an owned model's pure-decode step in one call (``matvec``, ``qmatmul``,
  ``rms_norm``, ``rope_kv`` inside it).
"""
