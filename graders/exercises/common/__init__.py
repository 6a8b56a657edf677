"""What several notebooks' graders share: naming a mistake, the first activation that differs,
watching submodules, the next-token loss, small seeded models, the kernels and library code that
answer exercises, the config cases, the properties of an output."""
