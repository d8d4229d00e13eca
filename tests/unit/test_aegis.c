/* Pure pieces of the supervised-run machinery: data skip windows (merge, mapping), ZAYA_FAULT parsing, the loss
 * spike detector and the derived hang timeout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/faultinject.h"
#include "train/loader.h"
#include "aegis/supervisor.h"
#include "test.h"

static DataWindow win(uint64_t a, uint64_t b) { return (DataWindow){a, b}; }

TEST(skip_window_parse_accepts_and_rejects) {
    DataWindow w;
    ZyErr err;
    CHECK(skip_window_parse("5:9", &w, &err) == 0 && w.first == 5 && w.last == 9);
    CHECK(skip_window_parse("7", &w, &err) == 0 && w.first == 7 && w.last == 7);
    CHECK(skip_window_parse("0:0", &w, &err) == 0 && w.first == 0 && w.last == 0);
    const char *bad[] = {"", ":", "3:", ":4", "-1:2", "9:5", "a:b", "1:2:3", "1.5:2", " 1:2", "99999999999999999999:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        CHECK_MSG(skip_window_parse(bad[i], &w, &err) != 0, "accepted \"%s\"", bad[i]);
        CHECK_MSG(strstr(err.msg, "skip window") != NULL, "message for \"%s\": %s", bad[i], err.msg);
    }
}

TEST(skip_windows_merge_sorted_idempotent) {
    SkipWindows s = {0};
    ZyErr err;
    REQUIRE(skip_windows_add(&s, win(10, 12), &err) == 0);
    REQUIRE(skip_windows_add(&s, win(3, 3), &err) == 0);
    REQUIRE(skip_windows_add(&s, win(10, 12), &err) == 0); /* again: no change */
    CHECK(s.count == 2 && s.w[0].first == 3 && s.w[0].last == 3 && s.w[1].first == 10 && s.w[1].last == 12);
    REQUIRE(skip_windows_add(&s, win(13, 14), &err) == 0); /* touches 10:12 */
    CHECK(s.count == 2 && s.w[1].first == 10 && s.w[1].last == 14);
    REQUIRE(skip_windows_add(&s, win(4, 9), &err) == 0); /* bridges 3:3 and 10:14 */
    CHECK(s.count == 1 && s.w[0].first == 3 && s.w[0].last == 14);
    REQUIRE(skip_windows_add(&s, win(20, 20), &err) == 0);
    REQUIRE(skip_windows_add(&s, win(0, 1), &err) == 0);
    CHECK(s.count == 3 && s.w[0].first == 0 && s.w[1].first == 3 && s.w[2].first == 20);
    CHECK(skip_windows_add(&s, win(5, 4), &err) != 0);
}

TEST(skip_windows_contains_and_next_trained) {
    SkipWindows s = {0};
    ZyErr err;
    REQUIRE(skip_windows_add(&s, win(2, 4), &err) == 0);
    REQUIRE(skip_windows_add(&s, win(6, 6), &err) == 0);
    CHECK(!skip_windows_contains(&s, 1) && skip_windows_contains(&s, 2) && skip_windows_contains(&s, 4));
    CHECK(!skip_windows_contains(&s, 5) && skip_windows_contains(&s, 6) && !skip_windows_contains(&s, 7));
    CHECK(skip_windows_next_trained(&s, 0) == 0);
    CHECK(skip_windows_next_trained(&s, 2) == 5);
    CHECK(skip_windows_next_trained(&s, 3) == 5);
    CHECK(skip_windows_next_trained(&s, 6) == 7);
    SkipWindows empty = {0};
    CHECK(skip_windows_next_trained(&empty, 9) == 9 && !skip_windows_contains(&empty, 0));
    /* mapping optimizer steps to data indices: with 2:4 and 6 skipped, steps 0..3 train batches 0,1,5,7 */
    uint64_t d = 0, trained[4];
    for (int step = 0; step < 4; step++) {
        d = skip_windows_next_trained(&s, d);
        trained[step] = d++;
    }
    CHECK(trained[0] == 0 && trained[1] == 1 && trained[2] == 5 && trained[3] == 7);
}

TEST(fault_spec_parse) {
    FaultPlan p;
    memset(&p, 0, sizeof p);
    ZyErr err;
    REQUIRE(fault_parse("crash@5,hang@7:1,nan@3,corrupt@10:0,truncate@12", &p, &err) == 0);
    REQUIRE(p.count == 5);
    CHECK(p.f[0].kind == FAULT_CRASH && p.f[0].step == 5 && p.f[0].rank == 0);
    CHECK(p.f[1].kind == FAULT_HANG && p.f[1].step == 7 && p.f[1].rank == 1);
    CHECK(p.f[2].kind == FAULT_NAN && p.f[3].kind == FAULT_CORRUPT && p.f[4].kind == FAULT_TRUNCATE);
    const char *bad[] = {"", "crash", "crash@", "crash@0", "crash@-1", "boom@3", "crash@3:", "crash@3:x", "crash@3,",
                         ",crash@3", "nan@1.5", "crash@3:1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&p, 0, sizeof p);
        err.msg[0] = '\0';
        CHECK_MSG(fault_parse(bad[i], &p, &err) != 0, "accepted \"%s\"", bad[i]);
        CHECK_MSG(strstr(err.msg, "ZAYA_FAULT") != NULL, "message for \"%s\": %s", bad[i], err.msg);
    }
    memset(&p, 0, sizeof p);
    CHECK(fault_parse("boom@3", &p, &err) != 0 && strstr(err.msg, "unknown kind \"boom\""));
}

TEST(fault_claim_fires_once_per_run_dir) {
    char dir[256];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "fault") == 0);
    setenv("ZAYA_FAULT", "nan@4:1,crash@6", 1);
    FaultPlan rank0, rank1;
    ZyErr err;
    REQUIRE(fault_plan_from_env(&rank0, dir, 0, &err) == 0 && fault_plan_from_env(&rank1, dir, 1, &err) == 0);
    unsetenv("ZAYA_FAULT");
    CHECK(!fault_claim(&rank0, FAULT_NAN, 4)); /* rank 1's */
    CHECK(!fault_claim(&rank1, FAULT_NAN, 3));
    CHECK(fault_claim(&rank1, FAULT_NAN, 4));
    CHECK(!fault_claim(&rank1, FAULT_NAN, 4)); /* the marker keeps it from firing again */
    FaultPlan again;
    setenv("ZAYA_FAULT", "nan@4:1", 1);
    REQUIRE(fault_plan_from_env(&again, dir, 1, &err) == 0);
    unsetenv("ZAYA_FAULT");
    CHECK(!fault_claim(&again, FAULT_NAN, 4)); /* a relaunched job */
    FaultPlan none;
    REQUIRE(fault_plan_from_env(&none, dir, 0, &err) == 0);
    CHECK(none.count == 0 && !fault_claim(&none, FAULT_CRASH, 6));
    zy_test_rmtree(dir);
}

TEST(spike_detector_flags_outliers_only) {
    SpikeDetector d;
    ZyErr err;
    REQUIRE(spike_init(&d, 20, 6.0, 10, &err) == 0);
    double z;
    /* a slowly falling, slightly noisy loss: never a spike */
    for (int i = 0; i < 60; i++) {
        double loss = 5.0 - 0.01 * i + 0.02 * ((i * 7919) % 11 - 5) / 5.0;
        CHECK_MSG(!spike_observe(&d, loss, &z), "step %d flagged (z %.2f)", i, z);
    }
    CHECK(spike_observe(&d, 9.0, &z) && z > 6);
    CHECK(spike_observe(&d, 9.0, &z)); /* spikes stay out of the window: the next one is caught too */
    CHECK(!spike_observe(&d, 4.3, &z)); /* a drop is not a spike */
    CHECK(spike_observe(&d, NAN, &z) && isinf(z));
    /* too few samples: no verdict yet */
    SpikeDetector fresh;
    REQUIRE(spike_init(&fresh, 20, 3.0, 10, &err) == 0);
    for (int i = 0; i < 5; i++) CHECK(!spike_observe(&fresh, 1.0 + (i == 4 ? 100 : 0), &z));
    /* a flat history does not turn rounding noise into a spike */
    SpikeDetector flat;
    REQUIRE(spike_init(&flat, 10, 6.0, 5, &err) == 0);
    for (int i = 0; i < 10; i++) spike_observe(&flat, 2.0, &z);
    CHECK(!spike_observe(&flat, 2.0000001, &z));
    CHECK(spike_observe(&flat, 2.5, &z));
    CHECK(spike_init(&flat, 1, 6, 1, &err) != 0 && spike_init(&flat, 10, 0, 5, &err) != 0 &&
          spike_init(&flat, 10, 6, 11, &err) != 0);
}

TEST(hang_timeout_from_step_times) {
    double t[] = {0.5, 0.1, 0.2, 9.0, 0.2};
    CHECK_NEAR(supervisor_hang_timeout(t, 5, 30, 10), 30, 1e-12);  /* median 0.2 s: the floor */
    CHECK_NEAR(supervisor_hang_timeout(t, 5, 1, 10), 2.0, 1e-12);  /* 10 x median */
    CHECK_NEAR(supervisor_hang_timeout(t, 4, 0, 10), 3.5, 1e-12);  /* even count: mean of the middle two */
    CHECK_NEAR(supervisor_hang_timeout(NULL, 0, 12, 10), 12, 1e-12);
}
