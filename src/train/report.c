#include "train/report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/model.h"

/* Keeps the lines of metrics.jsonl whose "step" is <= keep_step. */
static int truncate_metrics(const char *path, int64_t keep_step, ZyErr *err) {
    char *text;
    size_t len;
    if (access(path, F_OK) != 0) return 0;
    if (zy_read_file(path, &text, &len, err)) return -1;
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return zy_fail(err, "out of memory");
    }
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
        int keep = cJSON_IsNumber(s) && s->valuedouble <= (double)keep_step;
        cJSON_Delete(o);
        if (!keep) continue;
        size_t l = strlen(line);
        memcpy(out + n, line, l);
        out[n + l] = '\n';
        n += l + 1;
    }
    int rc = zy_write_file_atomic(path, out, n, err);
    free(text);
    free(out);
    return rc;
}

int report_open(Report *r, const RunConfig *rc, const ZayaConfig *cfg, double peak_gflops, int64_t resume_step,
                int quiet, ZyErr *err) {
    memset(r, 0, sizeof *r);
    r->enabled = 1;
    r->rc = rc;
    r->cfg = *cfg;
    r->peak_gflops = peak_gflops;
    r->quiet = quiet;
    r->tty = isatty(STDERR_FILENO);
    snprintf(r->out_dir, sizeof r->out_dir, "%s", rc->out_dir);
    char path[RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", rc->out_dir);
    if (resume_step >= 0) {
        if (truncate_metrics(path, resume_step, err)) return -1;
    }
    r->metrics = fopen(path, resume_step >= 0 ? "a" : "w");
    if (!r->metrics) return zy_fail(err, "%s: cannot open for writing", path);
    snprintf(path, sizeof path, "%s/events.log", rc->out_dir);
    r->events = fopen(path, "a");
    if (!r->events) {
        fclose(r->metrics);
        return zy_fail(err, "%s: cannot open for writing", path);
    }
    return 0;
}

void report_close(Report *r) {
    if (r->metrics) fclose(r->metrics);
    if (r->events) fclose(r->events);
    r->metrics = r->events = NULL;
}

void report_event(Report *r, const char *fmt, ...) {
    if (!r->enabled) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    time_t now = time(NULL);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", gmtime(&now));
    if (r->events) {
        fprintf(r->events, "%s %s\n", stamp, msg);
        fflush(r->events);
    }
    if (!r->quiet) fprintf(stderr, "%s%s\n", r->tty ? "\r\033[K" : "", msg);
}

static void format_duration(double s, char *out, size_t cap) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(out, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, cap, "%lds", t);
}

/* One metrics.jsonl record: o compact on one line (then freed), flushed so a crash loses none. */
static void write_record(Report *r, cJSON *o) {
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (r->metrics && line) {
        fprintf(r->metrics, "%s\n", line);
        fflush(r->metrics);
    }
    free(line);
}

/* A number metrics.jsonl reads back as the same double: cJSON prints 15 significant digits whenever they read back
 * within a relative DBL_EPSILON, which can be the neighbouring double (a loss then differs by an ulp from the same
 * loss printed exactly, as bench train prints it). The shortest of 15, 16 and 17 digits that reads back exactly;
 * null for NaN and infinities, as cJSON writes them. */
static void add_exact(cJSON *o, const char *key, double v) {
    if (!isfinite(v)) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    char buf[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    cJSON_AddRawToObject(o, key, buf);
}

void report_step(Report *r, const StepMetrics *m) {
    if (!r->enabled) return;
    double tps = m->step_tokens / (m->step_seconds > 0 ? m->step_seconds : 1e-9);
    r->tokens_per_s = r->tokens_per_s > 0 ? 0.9 * r->tokens_per_s + 0.1 * tps : tps;
    double flops = model_train_flops_per_token(&r->cfg, m->seq_len);
    double mfu = r->peak_gflops > 0 ? r->tokens_per_s * flops / (r->peak_gflops * 1e9) : 0;
    double mean_entropy = 0;
    for (int l = 0; l < m->n_layers; l++) mean_entropy += m->entropy[l] / m->n_layers;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", "train");
    cJSON_AddNumberToObject(o, "step", (double)m->step);
    cJSON_AddNumberToObject(o, "phase", m->phase);
    add_exact(o, "loss", m->loss);
    add_exact(o, "lr", m->lr);
    add_exact(o, "grad_norm", m->grad_norm);
    cJSON_AddNumberToObject(o, "tokens", m->tokens_seen);
    cJSON_AddNumberToObject(o, "seq_len", m->seq_len);
    cJSON_AddNumberToObject(o, "tokens_per_s", tps);
    cJSON_AddNumberToObject(o, "mfu", mfu);
    cJSON_AddNumberToObject(o, "scatter_factor", m->scatter);
    cJSON_AddNumberToObject(o, "step_seconds", m->step_seconds);
    cJSON_AddNumberToObject(o, "comm_seconds", m->comm_seconds);
    cJSON_AddNumberToObject(o, "data_index", (double)m->data_index);
    cJSON_AddItemToObject(o, "routing_entropy", cJSON_CreateDoubleArray(m->entropy, m->n_layers));
    write_record(r, o);
    if (r->quiet) return;
    double now = zy_now_seconds();
    int last = m->step == m->end_step;
    if (!last && now - r->last_print < (r->tty ? 0.2 : 0) && m->step % r->rc->log_interval != 0) return;
    if (!r->tty && !last && m->step % r->rc->log_interval != 0) return;
    r->last_print = now;
    char eta[32];
    /* ETA from this process's average step time */
    format_duration((double)(m->end_step - m->step) * m->elapsed / fmax(1.0, (double)m->steps_run), eta, sizeof eta);
    char routing[96];
    if (r->have_routing) /* the worst layers of the last routing window */
        snprintf(routing, sizeof routing, "routing H %.2f (L%d) skip %.0f%% (L%d)", r->route_min_entropy,
                 r->route_min_layer, 100 * r->route_max_skip, r->route_max_skip_layer);
    else
        snprintf(routing, sizeof routing, "routing H %.2f", mean_entropy);
    fprintf(stderr, "%sstep %lld/%lld | phase %d/%d %s | loss %.4f | lr %.2e | %.1fk tok/s | MFU %.1f%% | %s | ETA %s%s",
            r->tty ? "\r\033[K" : "", (long long)m->step, (long long)r->rc->total_steps, m->phase + 1, r->rc->n_phases,
            r->rc->phases[m->phase].name, m->loss, m->lr, r->tokens_per_s / 1000, 100 * mfu, routing, eta,
            r->tty && !last ? "" : "\n");
    fflush(stderr);
}

void report_routing(Report *r, int64_t step, int phase, const RoutingWindow *window, const float *const *biases,
                    int classes) {
    if (!r->enabled) return;
    const int L = window->num_layers, E = window->num_experts;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", "routing");
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "phase", phase);
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *entropy = cJSON_AddArrayToObject(o, "entropy");
    cJSON *skip = cJSON_AddArrayToObject(o, "skip_rate"), *max_load = cJSON_AddArrayToObject(o, "max_load");
    cJSON *gate = cJSON_AddArrayToObject(o, "gate"), *p_skip = cJSON_AddArrayToObject(o, "p_skip");
    cJSON *load = cJSON_AddArrayToObject(o, "load"), *bias = cJSON_AddArrayToObject(o, "bias");
    r->have_routing = 1;
    r->route_min_entropy = INFINITY, r->route_max_skip = -1;
    for (int l = 0; l < L; l++) {
        const int64_t *c = window->total.counts + (size_t)l * (E + 1);
        LayerRouting s = routing_window_layer(window, l);
        cJSON_AddItemToArray(tokens, cJSON_CreateNumber((double)s.tokens));
        cJSON_AddItemToArray(entropy, cJSON_CreateNumber(s.entropy));
        cJSON_AddItemToArray(skip, cJSON_CreateNumber(s.skip_rate));
        cJSON_AddItemToArray(max_load, cJSON_CreateNumber(s.max_load));
        cJSON_AddItemToArray(gate, cJSON_CreateNumber(s.gate));
        cJSON_AddItemToArray(p_skip, cJSON_CreateNumber(s.p_skip));
        cJSON *row = cJSON_CreateArray();
        for (int e = 0; e < E; e++)
            cJSON_AddItemToArray(row, cJSON_CreateNumber(s.tokens ? (double)c[e] / (double)s.tokens : 0.0));
        cJSON_AddItemToArray(load, row);
        row = cJSON_CreateArray();
        for (int e = 0; e < classes; e++) cJSON_AddItemToArray(row, cJSON_CreateNumber(biases[l][e]));
        cJSON_AddItemToArray(bias, row);
        if (s.entropy < r->route_min_entropy) r->route_min_entropy = s.entropy, r->route_min_layer = l;
        if (s.skip_rate > r->route_max_skip) r->route_max_skip = s.skip_rate, r->route_max_skip_layer = l;
    }
    write_record(r, o);
}

void report_skip(Report *r, int64_t step, int64_t first, int64_t last) {
    if (!r->enabled) return;
    if (r->metrics) {
        fprintf(r->metrics, "{\"kind\":\"skip\",\"step\":%lld,\"data_first\":%lld,\"data_last\":%lld}\n",
                (long long)step, (long long)first, (long long)last);
        fflush(r->metrics);
    }
    report_event(r, "skipped data batches %lld..%lld before step %lld (skip window)", (long long)first, (long long)last,
                 (long long)step);
}

void report_eval(Report *r, int64_t step, int phase, const char *name, double value) {
    if (!r->enabled) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", "eval");
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "phase", phase);
    cJSON_AddStringToObject(o, "name", name);
    add_exact(o, "value", value);
    write_record(r, o);
    report_event(r, "eval step %lld: %s = %.4f", (long long)step, name, value);
}

/* metrics.jsonl → whitespace tables for gnuplot: train.tsv (step loss entropy_0..), val.tsv (step val_loss). */
int report_plot(const char *out_dir, const RunConfig *rc, ZyErr *err) {
    char path[RUN_PATH + 64], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    if (zy_read_file(path, &text, &len, err)) return -1;
    char train_path[RUN_PATH + 64], val_path[RUN_PATH + 64], task_path[RUN_PATH + 64], route_path[RUN_PATH + 64];
    snprintf(train_path, sizeof train_path, "%s/plot_train.tsv", out_dir);
    snprintf(val_path, sizeof val_path, "%s/plot_val.tsv", out_dir);
    snprintf(task_path, sizeof task_path, "%s/plot_tasks.tsv", out_dir);
    snprintf(route_path, sizeof route_path, "%s/plot_routing.tsv", out_dir);
    /* task metrics: one gnuplot data block per metric name, in order of first appearance */
    enum { MAX_SERIES = 32 };
    char series[MAX_SERIES][160];
    char *series_data[MAX_SERIES] = {0};
    size_t series_len[MAX_SERIES] = {0};
    int n_series = 0;
    FILE *ft = fopen(train_path, "w"), *fv = fopen(val_path, "w"), *fr = fopen(route_path, "w");
    if (!ft || !fv || !fr) {
        if (ft) fclose(ft);
        if (fv) fclose(fv);
        if (fr) fclose(fr);
        free(text);
        return zy_fail(err, "%s: cannot write plot data", out_dir);
    }
    int n_layers = 0, n_route_layers = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        if (!o) continue;
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
        if (cJSON_IsString(kind) && cJSON_IsNumber(step)) {
            if (strcmp(kind->valuestring, "train") == 0) {
                const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
                const cJSON *ent = cJSON_GetObjectItemCaseSensitive(o, "routing_entropy");
                fprintf(ft, "%.0f %.6g", step->valuedouble, cJSON_IsNumber(loss) ? loss->valuedouble : NAN);
                const cJSON *e;
                int k = 0;
                cJSON_ArrayForEach(e, ent) {
                    fprintf(ft, " %.6g", e->valuedouble);
                    k++;
                }
                if (k > n_layers) n_layers = k;
                fprintf(ft, "\n");
            } else if (strcmp(kind->valuestring, "routing") == 0) { /* step entropy_0.. skip_0.. */
                const cJSON *ent = cJSON_GetObjectItemCaseSensitive(o, "entropy");
                const cJSON *skip = cJSON_GetObjectItemCaseSensitive(o, "skip_rate");
                int k = cJSON_GetArraySize(ent);
                if (n_route_layers == 0) n_route_layers = k;
                if (k == n_route_layers && cJSON_GetArraySize(skip) == k) {
                    const cJSON *e;
                    fprintf(fr, "%.0f", step->valuedouble);
                    cJSON_ArrayForEach(e, ent) fprintf(fr, " %.6g", cJSON_IsNumber(e) ? e->valuedouble : NAN);
                    cJSON_ArrayForEach(e, skip) fprintf(fr, " %.6g", cJSON_IsNumber(e) ? e->valuedouble : NAN);
                    fprintf(fr, "\n");
                }
            } else if (strcmp(kind->valuestring, "eval") == 0) {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "value");
                if (cJSON_IsString(name) && strcmp(name->valuestring, "val_loss") == 0 && cJSON_IsNumber(v)) {
                    fprintf(fv, "%.0f %.6g\n", step->valuedouble, v->valuedouble);
                } else if (cJSON_IsString(name) && cJSON_IsNumber(v)) {
                    int k = 0;
                    while (k < n_series && strcmp(series[k], name->valuestring) != 0) k++;
                    if (k == n_series && n_series < MAX_SERIES)
                        snprintf(series[n_series++], sizeof series[0], "%s", name->valuestring);
                    if (k < n_series) {
                        char row[64];
                        int len_row = snprintf(row, sizeof row, "%.0f %.6g\n", step->valuedouble, v->valuedouble);
                        char *grown = realloc(series_data[k], series_len[k] + (size_t)len_row + 1);
                        if (grown) {
                            memcpy(grown + series_len[k], row, (size_t)len_row + 1);
                            series_data[k] = grown;
                            series_len[k] += (size_t)len_row;
                        }
                    }
                }
            }
        }
        cJSON_Delete(o);
    }
    fclose(ft);
    fclose(fv);
    fclose(fr);
    free(text);
    FILE *fk = fopen(task_path, "w");
    for (int k = 0; k < n_series; k++) {
        if (fk) fprintf(fk, "%s%s", k ? "\n\n" : "", series_data[k] ? series_data[k] : "");
        free(series_data[k]);
    }
    if (fk) fclose(fk);
    char script_path[RUN_PATH + 64];
    snprintf(script_path, sizeof script_path, "%s/plots.gp", out_dir);
    FILE *g = fopen(script_path, "w");
    if (!g) return zy_fail(err, "%s: cannot write", script_path);
    fprintf(g, "set terminal pngcairo size 1100,600 noenhanced\nset grid\nset key outside right top\n");
    for (int i = 1; i < rc->n_phases; i++)
        fprintf(g, "set arrow from %lld, graph 0 to %lld, graph 1 nohead dt 2 lc rgb 'gray40'\n",
                (long long)rc->phases[i].first_step, (long long)rc->phases[i].first_step);
    for (int i = 0; i < rc->n_phases; i++)
        fprintf(g, "set label %d '%s' at %lld, graph 0.04 offset 0.5,0 tc rgb 'gray30'\n", i + 1, rc->phases[i].name,
                (long long)rc->phases[i].first_step);
    fprintf(g, "set output '%s/loss.png'\nset title 'zaya: loss'\nset xlabel 'step'\nset ylabel 'cross-entropy'\n", out_dir);
    fprintf(g, "plot '%s' using 1:2 with lines lw 1 lc rgb '#4477aa' title 'train'", train_path);
    fprintf(g, ", '%s' using 1:2 with linespoints pt 7 ps 0.8 lw 2 lc rgb '#cc3311' title 'val'\n", val_path);
    /* routing.png: per-layer entropy over the real experts (top) and skip rate (bottom), one point per window */
    const int RL = n_route_layers;
    const char *route_src = RL ? route_path : train_path; /* metrics written before routing windows existed */
    fprintf(g, "set output '%s/routing.png'\nset terminal pngcairo size 1100,800 noenhanced\n"
               "set multiplot layout 2,1\nset yrange [0:1.05]\nset xlabel ''\n"
               "set title 'zaya: routing entropy H(f)/ln E over the real experts, per layer'\n"
               "set ylabel 'normalised entropy'\n", out_dir);
    int curves = RL ? RL : n_layers;
    if (curves > 0) {
        fprintf(g, "plot ");
        for (int l = 0; l < curves; l++)
            fprintf(g, "%s'%s' using 1:%d with lines lw 1.5 title 'layer %d'", l ? ", " : "", route_src,
                    RL ? l + 2 : l + 3, l);
        fprintf(g, "\n");
    } else {
        fprintf(g, "set label 90 'no routing data' at graph 0.5, graph 0.5 center\nplot NaN notitle\nunset label 90\n");
    }
    fprintf(g, "set title 'zaya: skip-expert rate per layer'\nset ylabel 'share of tokens skipped'\nset xlabel 'step'\n");
    if (RL > 0) {
        fprintf(g, "plot ");
        for (int l = 0; l < RL; l++)
            fprintf(g, "%s'%s' using 1:%d with lines lw 1.5 title 'layer %d'", l ? ", " : "", route_path, RL + l + 2, l);
        fprintf(g, "\n");
    } else {
        fprintf(g, "set label 90 'no routing windows in metrics.jsonl' at graph 0.5, graph 0.5 center\nplot NaN notitle\n"
                   "unset label 90\n");
    }
    fprintf(g, "unset multiplot\nset terminal pngcairo size 1100,600 noenhanced\nset xlabel 'step'\n");
    if (n_series > 0) {
        fprintf(g, "set output '%s/eval_tasks.png'\nset title 'zaya: held-out tasks'\nset ylabel 'accuracy / exact match'\n"
                   "set yrange [0:1.02]\nplot ", out_dir);
        for (int k = 0; k < n_series; k++)
            fprintf(g, "%s'%s' index %d using 1:2 with linespoints pt 7 ps 0.6 title '%s'", k ? ", " : "", task_path, k,
                    series[k]);
        fprintf(g, "\n");
    }
    fclose(g);
    return report_run_gnuplot(script_path, err);
}

int report_run_gnuplot(const char *script_path, ZyErr *err) {
    char cmd[3 * RUN_PATH];
    snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", script_path);
    FILE *p = popen(cmd, "r");
    if (!p) return zy_fail(err, "cannot run gnuplot");
    char buf[512], first[512] = "";
    while (fgets(buf, sizeof buf, p))
        if (!first[0]) snprintf(first, sizeof first, "%s", buf);
    int status = pclose(p);
    if (status != 0) return zy_fail(err, "gnuplot failed (is it installed?): %s", first);
    return 0;
}
