"""The machine: its CPU's instruction sets, its NVIDIA GPUs and their memory, and the energy it draws."""
