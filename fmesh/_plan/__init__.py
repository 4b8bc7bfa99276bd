"""``fmesh plan``: run a trainer's mesh code for chosen ranks of a fake world."""
