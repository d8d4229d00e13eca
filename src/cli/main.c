/* zaya: the ZAYA1 training system — command-line entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "commands.h"
#include "kernels/blas_core.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/quant_many.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"train", cmd_train_model, "train a model: curriculum, checkpoints, resume (zaya train RUN.json)"},
    {"ablate", cmd_ablate, "train variants of a model side by side and compare them (zaya ablate SPEC.json)"},
    {"supervise", cmd_supervise, "run a training job and heal it: restart on crash, hang, NaN (zaya supervise -- CMD)"},
    {"ckpt", cmd_ckpt, "inspect a checkpoint or export it as a Hugging Face model directory"},
    {"init", cmd_init, "create a model directory initialised from scratch"},
    {"forward", cmd_forward, "run the model on token ids: loss, logits, gradients"},
    {"convert", cmd_convert, "re-write a model directory (f32 or bf16)"},
    {"quantize", cmd_quantize, "quantize a model's matrices to 8 or 4 bits (MLX's affine layout, as mlx-lm writes it)"},
    {"generate", cmd_generate, "generate text from a prompt (cached decoding, sampling)"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with continuous batching (zaya serve --model DIR)"},
    {"reason", cmd_reason, "Markovian RSA: rounds of N traces, each from K tails of the last (zaya reason --model DIR)"},
    {"eval", cmd_eval, "evaluate: multiple-choice / exact-match tasks, held-out loss"},
    {"debug", cmd_debug, "developer checks used by the test suite (debug optim ...)"},
    {"tokenizer", cmd_tokenizer, "train a byte-level BPE tokenizer (HF tokenizer.json); encode, decode"},
    {"data", cmd_data, "synthetic curriculum corpus (synth); text -> token shards (prepare, info)"},
    {"bench", cmd_bench, "benchmarks: MPI collectives in the nccl-tests format (mpirun ... zaya bench comm)"},
    {"info", cmd_system_info, "version, CPU features and the kernel level chosen, BLAS, threads, GPU support"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: zaya <command> [options]   (zaya <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

/* Runtime settings that the OpenMP and OpenBLAS libraries read once, when they load (before main), so zaya
 * sets what the user left unset and re-executes itself once:
 * - OMP_WAIT_POLICY=passive: idle OpenMP threads sleep instead of spinning; on a shared or oversubscribed
 *   machine spinning made a forward pass 4x slower (3.8 s vs 0.84 s measured on 2 busy cores).
 * - OPENBLAS_CORETYPE: the OpenBLAS core for the process's kernel level when the library picked another
 *   (src/kernels/blas_core.h: a CPU newer than the library gets its SSE or AVX2 kernels, at a quarter to a half of
 *   the speed; a ZAYA_CPU level below the best holds OpenBLAS to the same instructions). ZAYA_BLAS_CORE_WHY carries
 *   the reason to zaya info.
 * - Except when decoding interactively (generate, serve, reason, bench decode, and bench gemm --weights and bench quant,
 *   which time decoding's products): a token runs ~100 small parallel regions, and
 *   waking a sleeping thread costs more than each one's work (bench-medium bf16 decode, 2 threads: 125 tok/s
 *   passive, 205-229 with a bounded spin), so idle threads spin for GOMP_SPINCOUNT=10000 (~0.1 ms) before
 *   sleeping. Training keeps passive: two 2-thread processes on 2 cores ran the demo step at ~8k tok/s each
 *   passive, ~3-4k with this spin and ~500 with OMP_WAIT_POLICY=active.
 * A value the user set always wins. */
static int decodes_interactively(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "generate") == 0 || strcmp(argv[1], "serve") == 0 ||
                      strcmp(argv[1], "reason") == 0))
        return 1;
    if (argc < 3 || strcmp(argv[1], "bench") != 0) return 0;
    if (strcmp(argv[2], "decode") == 0 || strcmp(argv[2], "quant") == 0) return 1;
    for (int i = 3; strcmp(argv[2], "gemm") == 0 && i < argc; i++)
        if (strcmp(argv[i], "--weights") == 0) return 1;
    return 0;
}

static void configure_runtime(int argc, char **argv) {
    if (getenv("ZAYA_RUNTIME_CONFIGURED")) return;
    int changed = 0;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        if (decodes_interactively(argc, argv))
            changed |= setenv("GOMP_SPINCOUNT", "10000", 1) == 0;
        else
            changed |= setenv("OMP_WAIT_POLICY", "passive", 1) == 0;
    }
#if defined(__x86_64__)
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    ZyCpuLevel level;
    const char *forced = getenv("ZAYA_CPU");
    if (zy_cpu_choose_level(forced, &ci, &level, NULL) == 0) {
        ZyBlasCoreChoice bc;
        zy_blas_core_choose(&ci, level, forced && *forced && strcasecmp(forced, "auto") != 0, zy_blas_core_name(),
                            getenv("OPENBLAS_CORETYPE"), &bc);
        if (bc.set && setenv("OPENBLAS_CORETYPE", bc.set, 1) == 0) {
            changed = 1;
            setenv("ZAYA_BLAS_CORE_WHY", bc.why, 1);
        }
    }
#endif
    if (!changed || setenv("ZAYA_RUNTIME_CONFIGURED", "1", 1) != 0) return;
    execv("/proc/self/exe", argv); /* on failure, carry on with the libraries' defaults */
}

int main(int argc, char **argv) {
    configure_runtime(argc, argv);
    ZyErr err; /* the kernel level: the best this CPU runs, or the one ZAYA_CPU names (an error if the CPU lacks it) */
    if (zy_cpu_init(getenv("ZAYA_CPU"), &err) != 0 || zy_bf16_weights_set(getenv("ZAYA_BF16_WEIGHTS"), &err) != 0 ||
        zy_quant_way_set(getenv("ZAYA_QUANT_WAY"), &err) != 0 ||
        zy_quant_many_set(getenv("ZAYA_QUANT_MANY"), &err) != 0) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc, argv);
    fprintf(stderr, "zaya: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
