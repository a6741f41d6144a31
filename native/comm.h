/* Shared-memory allreduce between the ranks of one host (pure C; MPI sets it up from Python).
 *
 * One POSIX shared-memory segment per group: rank 0 creates it under a name unique to the
 * group, the others open it, and it is unlinked as soon as every rank has mapped it. Each rank
 * owns a flag (a counter of the phases it has finished) and a slot per parity; a call copies
 * its vector into its slot, publishes its flag, and spins on the peers' flags. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct dn_comm dn_comm;

/* Map the segment `name` (rank 0 creates it, exclusively; others open it) for `world` ranks
 * with slots of `capacity` floats. NULL on failure with a message in err. */
dn_comm *dn_comm_open(const char *name, int rank, int world, size_t capacity, char *err,
                      size_t errlen);

/* Remove the name (the mapping stays valid); 0, or -1 with errno. */
int dn_comm_unlink(const char *name);

/* Unmap and free. */
void dn_comm_close(dn_comm *c);

/* x [n] <- the sum of every rank's x, in place; the same bits on every rank (the ranks add in
 * rank order). Waits at most timeout_s for a peer, and gives up at once when a peer process
 * has died. 0, or -1 with a message in err; after an error the group is broken and every later
 * call fails. */
int dn_comm_allreduce(dn_comm *c, float *x, size_t n, double timeout_s, char *err, size_t errlen);

/* Rank 0 assembles out [rows, starts[world]] whose columns starts[r]..starts[r+1] are rank r's
 * local [rows, starts[r+1] - starts[r]] (the vocabulary shards of the logits); the other ranks
 * pass out = NULL. Every shard must fit a slot (starts[r+1] - starts[r] <= capacity). 0, or -1
 * with a message in err (the group is then broken). */
int dn_comm_gather_columns(dn_comm *c, const float *local, float *out, size_t rows,
                           const int32_t *starts, double timeout_s, char *err, size_t errlen);

size_t dn_comm_capacity(const dn_comm *c);
/* How many times this rank waited for its peers so far, and the seconds it spent waiting. */
void dn_comm_waits(const dn_comm *c, uint64_t *waits, double *seconds);
int dn_comm_rank(const dn_comm *c);
int dn_comm_world(const dn_comm *c);

/* n from which a call reduces one share per rank and gathers the shares (reduce-scatter +
 * allgather) instead of every rank adding every vector. */
void dn_comm_set_split_threshold(dn_comm *c, size_t n);
