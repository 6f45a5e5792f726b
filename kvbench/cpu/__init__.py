"""How kvbench runs fast on this CPU: the matmul path per weight, threads, the heap and prefetch choices,
measured at start-up and kept per machine."""
