"""Window kernels: length(n), lengthBatch(n) and timeBatch(t) under sum/count/avg selectors, as the event path's windows/."""
