"""CPU benchmarks (not tests): each module prints a Markdown table for docs/benchmarks.md."""
