/* The subcommands of the zaya CLI; each returns the process exit status. */
#ifndef ZAYA_CLI_COMMANDS_H
#define ZAYA_CLI_COMMANDS_H

int cmd_init(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_reason(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_debug(int argc, char **argv);
int cmd_train_model(int argc, char **argv);
int cmd_ablate(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_supervise(int argc, char **argv);
/* zaya bench train (called by cmd_bench) */
int bench_train(int argc, char **argv);
int bench_decode(int argc, char **argv);
int bench_attention(int argc, char **argv);
int bench_quant(int argc, char **argv);
int bench_ckpt(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_system_info(int argc, char **argv);

#endif
