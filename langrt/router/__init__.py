"""The cache-aware router (`langrt router`, and `langrt launch --dp-size N`): requests spread
over langrt workers by prefix (an approximate radix tree per worker) or by load, health checks,
retries on another worker, and workers added and removed at run time."""
