/* faultinject: deliberate failures for testing the supervisor, off unless ZAYA_FAULT is set. The one seam
 * through which the trainer crashes, hangs, produces a non-finite step or damages its own checkpoint on purpose.
 *
 *   ZAYA_FAULT=KIND@STEP[:RANK][,KIND@STEP[:RANK]...]      (RANK defaults to 0)
 *   crash@S     the rank SIGKILLs itself right after completing step S (metrics step S)
 *   hang@S      the rank stops advancing forever right after completing step S (sleeps; only SIGKILL ends it)
 *   nan@S       the rank's loss and gradients of the update that would become step S are made non-finite
 *   corrupt@S   once the checkpoint of step S is published, the rank flips a byte of its model.safetensors
 *   truncate@S  once the checkpoint of step S is published, the rank truncates its model.safetensors
 *
 * Each fault fires at most once per run directory: before firing, the rank creates the marker
 * OUT_DIR/faults-fired/KIND@STEP:RANK (exclusively), so a relaunched job does not repeat it. */
#ifndef ZAYA_FAULTINJECT_H
#define ZAYA_FAULTINJECT_H

#include <stdint.h>

#include "util/util.h"

typedef enum { FAULT_CRASH, FAULT_HANG, FAULT_NAN, FAULT_CORRUPT, FAULT_TRUNCATE, FAULT_KIND_COUNT } FaultKind;

typedef struct {
    FaultKind kind;
    int64_t step;
    int rank;
} FaultSpec;

#define FAULT_MAX 64

typedef struct {
    int count;
    FaultSpec f[FAULT_MAX];
    int rank;              /* this process's rank */
    char marker_dir[4096]; /* OUT_DIR/faults-fired */
} FaultPlan;

const char *fault_kind_name(FaultKind k);
/* Parses a ZAYA_FAULT value into plan->f (appending); errors quote the bad item and say what was expected. */
int fault_parse(const char *text, FaultPlan *plan, ZyErr *err);
/* Empty plan unless the ZAYA_FAULT environment variable is set; then its parsed faults for this run directory. */
int fault_plan_from_env(FaultPlan *plan, const char *out_dir, int rank, ZyErr *err);
/* 1 if a fault of `kind` at `step` is planned for this rank and has not fired in this run directory yet: then the
 * marker is created and the caller must fire it. 0 otherwise (also when the marker cannot be created). */
int fault_claim(FaultPlan *plan, FaultKind kind, int64_t step);
/* After step `step` completed: fires a claimed crash or hang (neither returns). */
void fault_after_step(FaultPlan *plan, int64_t step);
/* After the checkpoint of `step` was published in dir: applies a claimed corrupt or truncate. */
int fault_after_publish(FaultPlan *plan, int64_t step, const char *dir, ZyErr *err);

#endif
