-- leaky_bucket: a shaper. The same meter as gcra, where capacity is the queue size:
-- an admitted request is held for delay = TAT - now, so that requests leave at count
-- per period; a request that does not fit in the queue is denied.
-- KEYS: the meter key K, a string: the time the queue empties (us).
-- Limit (one, see prelude.lua): count, period_us, capacity (the queue), 0.
-- Reply: one decision; delay is how long to hold an admitted request.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the queue is empty.
A.leaky_bucket = gcra_meter(true)
