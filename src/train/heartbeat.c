#include "train/heartbeat.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const state_names[HB_STATE_COUNT] = {"starting", "running", "done", "stopped", "nonfinite"};

const char *heartbeat_state_name(HeartbeatState s) { return s >= 0 && s < HB_STATE_COUNT ? state_names[s] : "?"; }

double heartbeat_unix_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void heartbeat_host(char *out, size_t cap) {
    if (gethostname(out, cap) != 0) snprintf(out, cap, "?");
    out[cap - 1] = '\0';
}

int heartbeat_path(char *out, size_t cap, const char *out_dir, int rank, ZyErr *err) {
    if (snprintf(out, cap, "%s/heartbeat/rank-%05d.json", out_dir, rank) >= (int)cap)
        return zy_fail(err, "%s: heartbeat path too long", out_dir);
    return 0;
}

int heartbeat_write(const char *out_dir, const Heartbeat *hb, ZyErr *err) {
    char dir[4096], path[4096], tmp[4200], text[640], loss[40];
    if (snprintf(dir, sizeof dir, "%s/heartbeat", out_dir) >= (int)sizeof dir ||
        heartbeat_path(path, sizeof path, out_dir, hb->rank, err))
        return zy_fail(err, "%s: heartbeat path too long", out_dir);
    if (zy_mkdirs(dir, err)) return -1;
    if (isfinite(hb->loss))
        snprintf(loss, sizeof loss, "%.9g", hb->loss);
    else
        snprintf(loss, sizeof loss, "null");
    int n = snprintf(text, sizeof text,
                     "{\"rank\": %d, \"world_size\": %d, \"host\": \"%s\", \"pid\": %ld, \"step\": %lld, \"data_index\": %lld, "
                     "\"loss\": %s, \"step_seconds\": %.6f, \"time\": %.3f, \"state\": \"%s\"}\n",
                     hb->rank, hb->world_size, hb->host, hb->pid, (long long)hb->step, (long long)hb->data_index, loss,
                     hb->step_seconds, hb->time, heartbeat_state_name(hb->state));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return zy_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
    ssize_t w = write(fd, text, (size_t)n);
    int e = errno;
    close(fd);
    if (w != n) return zy_fail(err, "%s: write failed: %s", tmp, strerror(e));
    if (rename(tmp, path) != 0) return zy_fail(err, "%s: rename failed: %s", path, strerror(errno));
    return 0;
}

int heartbeat_read(const char *path, Heartbeat *hb, ZyErr *err) {
    char *text;
    size_t len;
    if (zy_read_file(path, &text, &len, err)) return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!o) return zy_fail(err, "%s: invalid JSON", path);
    const char *keys[] = {"rank", "world_size", "pid", "step", "data_index", "step_seconds", "time"};
    double v[7];
    int rc = 0;
    for (int i = 0; i < 7 && !rc; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        if (!cJSON_IsNumber(it)) rc = zy_fail(err, "%s: missing or non-numeric \"%s\"", path, keys[i]);
        else v[i] = it->valuedouble;
    }
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(o, "host");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss"), *state = cJSON_GetObjectItemCaseSensitive(o, "state");
    int s = -1;
    if (!rc && cJSON_IsString(state))
        for (int i = 0; i < HB_STATE_COUNT; i++)
            if (strcmp(state->valuestring, state_names[i]) == 0) s = i;
    if (!rc && s < 0) rc = zy_fail(err, "%s: missing or unknown \"state\"", path);
    if (!rc) {
        *hb = (Heartbeat){.rank = (int)v[0], .world_size = (int)v[1], .pid = (long)v[2], .step = (int64_t)v[3],
                          .data_index = (int64_t)v[4], .loss = cJSON_IsNumber(loss) ? loss->valuedouble : NAN,
                          .step_seconds = v[5], .time = v[6], .state = (HeartbeatState)s};
        snprintf(hb->host, sizeof hb->host, "%s", cJSON_IsString(host) ? host->valuestring : "");
    }
    cJSON_Delete(o);
    return rc;
}
