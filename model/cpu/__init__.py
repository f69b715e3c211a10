"""CPU inference formats: weight formats (`weights`) and the fused int8 engine (`fused`)."""
