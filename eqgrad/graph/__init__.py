"""The graph floor: the IRs that several stages share (lazy graph, program and structure key, kernel
plan, loop IR) and the one NumPy interpreter of them all. Imports only the ground floor."""
