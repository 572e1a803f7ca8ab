"""The benchmarks: their registry and budgets, prompts, the verifier v(o, a*) and `bfspo prepare`."""
