/* heartbeat: one small JSON file per rank, OUT_DIR/heartbeat/rank-RRRRR.json, rewritten (temp file + rename, so a
 * reader never sees half a file) when the rank starts and after every completed step:
 *   {"rank", "world_size", "host", "pid", "step", "data_index", "loss", "step_seconds", "time", "state"}
 * step = optimizer updates done; data_index = the next data batch to plan (for "nonfinite": the offending batch);
 * time = unix seconds. The supervisor reads them to see progress, hangs and numerical failures. */
#ifndef ZAYA_HEARTBEAT_H
#define ZAYA_HEARTBEAT_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef enum { HB_STARTING, HB_RUNNING, HB_DONE, HB_STOPPED, HB_NONFINITE, HB_STATE_COUNT } HeartbeatState;

typedef struct {
    int rank, world_size;
    long pid;
    int64_t step, data_index;
    double loss;          /* NAN when none yet (written as null) */
    double step_seconds;
    double time;
    HeartbeatState state;
    char host[64];        /* where pid lives (a supervisor only signals or probes pids on its own host) */
} Heartbeat;

const char *heartbeat_state_name(HeartbeatState s);
/* Wall-clock unix time in seconds (the heartbeat's "time"). */
double heartbeat_unix_time(void);
/* OUT_DIR/heartbeat/rank-RRRRR.json */
int heartbeat_path(char *out, size_t cap, const char *out_dir, int rank, ZyErr *err);
/* This machine's host name (for Heartbeat.host). */
void heartbeat_host(char *out, size_t cap);
/* Writes the rank's heartbeat (creating OUT_DIR/heartbeat/). Not fsynced: it reports liveness, not durable state. */
int heartbeat_write(const char *out_dir, const Heartbeat *hb, ZyErr *err);
int heartbeat_read(const char *path, Heartbeat *hb, ZyErr *err);

#endif
