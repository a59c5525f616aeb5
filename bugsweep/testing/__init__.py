"""Test helpers shipped with the package, so tests, benchmarks and users' own CI can share them."""
