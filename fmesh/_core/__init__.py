"""The pure core: layouts, meshes, operations, queries, errors (no torch, no runtime)."""
