"""Native CPU kernels (C, compiled on the machine on first use) with a torch fallback.

- ``build``: compiles ``<name>.c`` from this folder once per machine and loads it, where the
  host allows (see its docstring); otherwise reports why and callers keep their torch path.
- ``decode_attention``: the decode-step attention of the CPU attention backend.
"""
