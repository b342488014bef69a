"""Everything that touches the outside: providers over httpx and event stores."""
