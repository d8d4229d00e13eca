/* calibrate: the importance of each matrix's input columns, for activation-aware quantization (`zaya quantize
 * --calibration DATA`). A product y = W x errs by Σ_j (W - Q)_ij x_j; over inputs whose columns are roughly
 * uncorrelated its expected square is Σ_j (W - Q)_ij² E[x_j²], so each column's squared error is weighted by the mean
 * square of what that column multiplies — llama.cpp's importance matrix (imatrix). The model is run over windows of
 * a token-shard directory's train split and the inputs of every quantizable matrix are summed: an expert's only over
 * the tokens routed to it. */
#ifndef ZAYA_CALIBRATE_H
#define ZAYA_CALIBRATE_H

#include "io/quant_io.h"
#include "io/shards.h"
#include "model/model.h"

typedef struct {
    long tokens;          /* tokens run */
    int windows;          /* windows of seq_len */
    int experts_unseen;   /* (layer, expert) pairs no calibration token was routed to: their weights stay uniform */
    double seconds;
} CalibrationReport;

/* GPTQ's Gram matrices are refused above this many bytes in all (the 8B's would be tens of GB). */
#define CALIBRATION_GRAM_MAX_BYTES 4e9

/* Runs m over `tokens` tokens of data (seq_len a window, windows spread evenly over the split) and fills imp (one
 * entry per tensor of m's table: NULL for what quant_holds does not take) with each column's mean square input,
 * plus a floor of QUANT_IMPORTANCE_FLOOR times the row's mean so that no column's error is free; with_gram also
 * the inputs' Gram matrices Σ x xᵀ (imp->gram, for --method gptq). */
int calibrate_importance(Model *m, ShardSet *data, int seq_len, long tokens, int with_gram, QuantImportance *imp,
                         CalibrationReport *rep, ZyErr *err);

#endif
