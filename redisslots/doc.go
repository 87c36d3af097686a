// Package redisslots is the Redis edge of global rates (SPEC §3 "Global
// rate", docs/scaling.md): the departure schedule that the replicas of a lane
// share, kept as one GCRA in Redis and reserved in leases by a Lua script on
// the Redis server's clock. It implements drain.GlobalSchedule; it is not a
// source of messages, hence a package of its own rather than part of
// sources. Its tests run a real redis-server.
package redisslots
