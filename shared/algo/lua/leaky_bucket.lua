-- leaky_bucket: a shaper. The same meter as gcra, where capacity is the queue size:
-- an admitted request is held for delay = TAT - now, so that requests leave at count
-- per period; a request that does not fit in the queue is denied.
-- KEYS: the meter key K, a string: the time the queue empties (us).
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the queue is empty.
A.leaky_bucket = {
  check = function(key, now, cost, lims) return gcra_check(key, now, cost, lims, true) end,
  refund = gcra_refund,
}
