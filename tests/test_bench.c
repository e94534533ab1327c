/*
 * test_bench.c: `kiln bench` without timing anything: the metric
 * arithmetic on made-up timestamps (a fake clock), the table writers'
 * exact text, the HTTP/SSE decoders fed in pieces, the profile loop on a
 * fake target, the SVG plot, and tiny in-process runs on a fixture that
 * check rows and that figures are positive (never how fast).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "bench/bench.h"
#include "bench/http.h"
#include "bench/inproc.h"
#include "bench/plot.h"
#include "bench/stats.h"
#include "bench/table.h"
#include "kiln.h"
#include "test.h"

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) <= 1e-9 * (1 + fabs((double)(b))))

static char *to_string(const struct bt_table *t, enum bt_format f) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    bt_write(t, f, m);
    fclose(m);
    return buf;
}

static void test_stats(void) {
    double xs[] = {4, 1, 3, 2};
    CHECK(NEAR(bench_percentile(xs, 4, 50), 2.5));
    CHECK(NEAR(bench_percentile(xs, 4, 99), 3.97), "%g", bench_percentile(xs, 4, 99)); /* numpy: 3.97 */
    CHECK(NEAR(bench_percentile(xs, 4, 0), 1) && NEAR(bench_percentile(xs, 4, 100), 4));
    CHECK(isnan(bench_percentile(xs, 0, 50)));
    struct bench_stat s = bench_stat_of(xs, 4);
    CHECK(s.n == 4 && NEAR(s.mean, 2.5) && NEAR(s.median, 2.5) && s.min == 1 && s.max == 4);
    CHECK(NEAR(s.sd, sqrt(5.0 / 3.0)), "sd %g", s.sd); /* sample sd */
    struct bench_stat one = bench_stat_of(xs, 1);
    CHECK(one.sd == 0 && one.median == 4);
    CHECK(isnan(bench_stat_of(xs, 0).mean));

    /* a request on a fake clock: sent at 10 s, chunks at 10.2, 10.25, 10.3, 10.4 */
    double ct[] = {10.2, 10.25, 10.3, 10.4};
    struct bench_req_times r = {.t_send = 10, .t_first = 10.2, .t_end = 10.4, .n_in = 100, .n_out = 4, .chunk_t = ct, .n_chunks = 4, .ok = 1};
    CHECK(NEAR(bench_ttft(&r), 0.2));
    CHECK(NEAR(bench_e2e(&r), 0.4));
    CHECK(NEAR(bench_tpot(&r), 0.2 / 3));
    CHECK(NEAR(bench_rate(100, bench_ttft(&r)), 500)); /* prefill tok/s = new tokens / TTFT */
    CHECK(NEAR(1.0 / bench_tpot(&r), 15));            /* decode tok/s = 1 / TPOT */
    CHECK(NEAR(bench_rate(100 + 4, bench_e2e(&r)), 260)); /* Qwen speed = (prompt + gen) / time */
    struct bench_req_times one_tok = r;
    one_tok.n_out = 1;
    CHECK(isnan(bench_tpot(&one_tok)));
    CHECK(isnan(bench_rate(5, 0)));

    /* serving summary: two requests and a failed one over 2 s */
    double c2[] = {11.5, 12.0};
    struct bench_req_times rs[3] = {r,
                                    {.t_send = 11, .t_first = 11.5, .t_end = 12.0, .n_in = 50, .n_out = 2, .chunk_t = c2, .n_chunks = 2, .ok = 1},
                                    {.ok = 0}};
    struct bench_serving_summary sm;
    bench_serving_summarize(rs, 3, 2.0, &sm);
    CHECK(sm.completed == 2 && sm.failed == 1);
    CHECK(sm.total_in == 150 && sm.total_out == 6);
    CHECK(NEAR(sm.req_tput, 1) && NEAR(sm.out_tput, 3) && NEAR(sm.in_tput, 75) && NEAR(sm.total_tput, 78));
    CHECK(NEAR(sm.ttft.mean, 350) && NEAR(sm.ttft.median, 350) && NEAR(sm.ttft.p99, 200 + 300 * 0.99), "p99 %g", sm.ttft.p99);
    CHECK(NEAR(sm.tpot.mean, (200.0 / 3 + 500) / 2), "tpot %g", sm.tpot.mean);
    CHECK(sm.itl.n == 4 && NEAR(sm.itl.median, 75), "itl n %d median %g", sm.itl.n, sm.itl.median); /* 50,50,100,500 */
    CHECK(NEAR(sm.e2e.mean, 700) && NEAR(sm.concurrency, 0.7));
}

static void small_table(struct bt_table *t) {
    bt_init(t, "demo", "demo table", BT_SPREAD_MINMAX);
    bt_col(t, "Model", "model", BT_STR, 0, 0);
    bt_col(t, "Input(tokens)", "input_tokens", BT_INT, 0, 0);
    bt_col(t, "TTFT(ms)", "ttft_ms", BT_NUM, 2, 1);
    int r = bt_row(t);
    bt_set_str(t, r, 0, "m,1");
    bt_set_num(t, r, 1, 128);
    bt_set_range(t, r, 2, 12.5, 0, 12, 13);
    r = bt_row(t);
    bt_set_str(t, r, 0, "m2");
    bt_set_num(t, r, 1, 2000);
    bt_set_num(t, r, 2, NAN);
    bt_meta(t, "backend", "CPU");
    bt_note(t, "skipped x");
    bt_footer(t, "TTFT = first token - send.");
    bt_summary(t, "answer", 42);
}

static void test_tables(void) {
    struct bt_table t;
    small_table(&t);
    char *md = to_string(&t, BT_MD);
    const char *want_md = "### demo table\n\n"
                          "- backend: CPU\n\n"
                          "| Model | Input(tokens) | TTFT(ms)     |\n"
                          "| ----- | ------------: | -----------: |\n"
                          "| m,1   |           128 | 12.50 ± 0.50 |\n"
                          "| m2    |          2000 |            - |\n"
                          "\n- note: skipped x\n"
                          "\nTTFT = first token - send.\n";
    CHECK(!strcmp(md, want_md), "md:\n%s", md);
    char *csv = to_string(&t, BT_CSV);
    const char *want_csv = "Model,Input(tokens),TTFT(ms),TTFT(ms) min,TTFT(ms) max\n"
                           "\"m,1\",128,12.50,12.00,13.00\n"
                           "m2,2000,,,\n";
    CHECK(!strcmp(csv, want_csv), "csv:\n%s", csv);
    char *js = to_string(&t, BT_JSON);
    CHECK(strstr(js, "\"rows\": [\n    {\"model\": \"m,1\", \"input_tokens\": 128, \"ttft_ms\": 12.5000, \"ttft_ms_min\": 12.0000, "
                     "\"ttft_ms_max\": 13.0000},\n    {\"model\": \"m2\", \"input_tokens\": 2000, \"ttft_ms\": null, "
                     "\"ttft_ms_min\": null, \"ttft_ms_max\": null}\n  ]") != NULL,
          "json:\n%s", js);
    CHECK(strstr(js, "\"answer\": 42.000,") && strstr(js, "\"profile\": \"demo\"") && strstr(js, "\"notes\": [\n    \"skipped x\"\n  ]"));
    /* a stddev table (pp-tg style) */
    struct bt_table s;
    bt_init(&s, "pp-tg", "", BT_SPREAD_SD);
    bt_col(&s, "test", "test", BT_STR, 0, 0);
    bt_col(&s, "t/s", "tps", BT_NUM, 2, 1);
    int r = bt_row(&s);
    bt_set_str(&s, r, 0, "pp512");
    bt_set_range(&s, r, 1, 100.123, 1.5, 98, 102);
    char *md2 = to_string(&s, BT_MD), *csv2 = to_string(&s, BT_CSV);
    CHECK(!strcmp(md2, "| test  | t/s           |\n| ----- | ------------: |\n| pp512 | 100.12 ± 1.50 |\n"), "md2:\n%s", md2);
    CHECK(!strcmp(csv2, "test,t/s,t/s sd\npp512,100.12,1.50\n"), "csv2:\n%s", csv2);
    enum bt_format f;
    CHECK(bt_parse_format("csv", &f) == 0 && f == BT_CSV && bt_parse_format("xml", &f) == -1);
    free(md), free(csv), free(js), free(md2), free(csv2);
    bt_free(&t);
    bt_free(&s);
}

/* ---- HTTP and SSE decoding, fed one byte at a time and in one piece ---- */

struct events {
    char all[1024];
    int n;
};

static int on_ev(const char *d, size_t n, void *ctx) {
    struct events *e = ctx;
    size_t l = strlen(e->all);
    snprintf(e->all + l, sizeof e->all - l, "[%.*s]", (int)n, d);
    e->n++;
    return 0;
}

static int to_sse(const char *p, size_t n, void *ctx) { return sse_feed(ctx, p, n); }

static void test_http(void) {
    struct http_url u;
    char err[256];
    CHECK(http_parse_url(&u, "http://127.0.0.1:8000/", err, sizeof err) == 0 && !strcmp(u.host, "127.0.0.1") &&
          !strcmp(u.port, "8000") && !strcmp(u.path, ""));
    CHECK(http_parse_url(&u, "http://h/api/", err, sizeof err) == 0 && !strcmp(u.port, "80") && !strcmp(u.path, "/api"));
    CHECK(http_parse_url(&u, "https://h", err, sizeof err) == -1);
    CHECK(http_parse_url(&u, "http://h:x1", err, sizeof err) == -1);

    const char *resp = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "19\r\ndata: {\"a\":1}\n\ndata: {\"b\"\r\n"
                       "9\r\n:2}\n\n: c\n\r\n"
                       "e\r\ndata: [DONE]\n\n\r\n"
                       "0\r\n\r\n";
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct events ev = {{0}, 0};
        struct sse s;
        sse_init(&s, on_ev, &ev);
        struct http_resp r;
        http_resp_init(&r, to_sse, &s);
        int rc = 0;
        size_t n = strlen(resp);
        if (bytewise)
            for (size_t i = 0; i < n && rc == 0; i++) rc = http_resp_feed(&r, resp + i, 1, err, sizeof err);
        else rc = http_resp_feed(&r, resp, n, err, sizeof err);
        CHECK(rc == 0 && r.done && r.status == 200 && r.chunked, "rc %d done %d: %s", rc, r.done, err);
        CHECK(!strcmp(ev.all, "[{\"a\":1}][{\"b\":2}][[DONE]]"), "events %s", ev.all);
        http_resp_free(&r);
        sse_free(&s);
    }
    /* Content-Length body, then a malformed chunk size */
    struct events ev = {{0}, 0};
    struct sse s;
    sse_init(&s, on_ev, &ev);
    struct http_resp r;
    http_resp_init(&r, to_sse, &s);
    const char *cl = "HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\n\r\ndata: nope\n\nEXTRA";
    CHECK(http_resp_feed(&r, cl, strlen(cl), err, sizeof err) == 0 && r.done && r.status == 404 && !strcmp(ev.all, "[nope]"));
    http_resp_free(&r);
    http_resp_init(&r, NULL, NULL);
    const char *bad = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
    CHECK(http_resp_feed(&r, bad, strlen(bad), err, sizeof err) == -1);
    http_resp_free(&r);
    sse_free(&s);
    /* nothing listens on port 1: a clear error, not a crash */
    http_parse_url(&u, "http://127.0.0.1:1", err, sizeof err);
    CHECK(http_request(&u, "GET", "/v1/models", NULL, 5, NULL, NULL, err, sizeof err) == -1 && strstr(err, "connect"), "%s", err);
}

/* ---- the profile loop on a fake target: a made-up clock, no engine ---- */

struct fake {
    double clock;
    int calls;
};

/* TTFT = 1 ms per new token + 0.1 ms per prefix token; 20 ms per later token, per batch */
static int fake_run(struct bench_target *t, const struct bench_job *j, struct bench_obs *o, char *err, size_t errlen) {
    struct fake *f = t->ctx;
    f->calls++;
    o->t_send = f->clock;
    double first = f->clock + 1e-3 * j->n_new * j->batch + 1e-4 * j->n_prefix;
    for (int b = 0; b < j->batch; b++) {
        o->t_first[b] = first;
        o->t_end[b] = first + 0.02 * (j->n_out - 1);
        o->n_out[b] = j->n_out;
    }
    o->peak_mem = 64.0 * (1 << 20);
    f->clock = first + 1;
    return 0;
}

/* a top-level JSON number (bt_summary), NAN when absent */
static double summ(const struct bt_table *t, const char *key) {
    for (int i = 0; i < t->n_summary; i++)
        if (!strcmp(t->summary[i].k, key)) return t->summary[i].v;
    return NAN;
}

static double cellv(struct bt_table *t, int row, const char *key) {
    int c = bt_find(t, key);
    if (c < 0 || row >= t->n_rows) return NAN;
    struct bt_cell *x = bt_cell(t, row, c);
    return x->set ? x->v : NAN;
}

static void test_profiles_fake(void) {
    struct fake f = {100, 0};
    struct bench_target tg = {.kind = "fake", .max_tokens = 16384, .max_ctx = 40960, .mem_what = "rss", .ctx = &f, .run = fake_run};
    struct bench_opts o;
    bench_opts_default(&o);
    o.reps = 2;
    snprintf(o.lab.model, sizeof o.lab.model, "m");
    struct bt_table t;
    char err[256];
    CHECK(bench_run_profile(&tg, &o, &t, err, sizeof err) == 0);
    CHECK(t.n_rows == 11, "prefix rows %d", t.n_rows); /* 5 without prefix, 6 with */
    CHECK(f.calls == 1 + 11 * 2, "calls %d", f.calls);   /* warm-up + 2 reps per row */
    CHECK(cellv(&t, 0, "input_tokens") == 128 && cellv(&t, 0, "prefix_tokens") == 0 && cellv(&t, 0, "prefill_len") == 128);
    CHECK(NEAR(cellv(&t, 0, "ttft_ms"), 128) && NEAR(cellv(&t, 0, "prefill_tps"), 1000));
    CHECK(NEAR(cellv(&t, 0, "tpot_ms"), 20) && NEAR(cellv(&t, 0, "decode_tps"), 50));
    CHECK(cellv(&t, 0, "output_tokens") == 16 && cellv(&t, 0, "measured_output") == 16 && cellv(&t, 0, "ctx_k") == 16);
    /* the last row: 16000 input = 15750 cached + 250 new */
    CHECK(cellv(&t, 10, "input_tokens") == 16000 && cellv(&t, 10, "prefix_tokens") == 15750 && cellv(&t, 10, "prefill_len") == 250);
    CHECK(NEAR(cellv(&t, 10, "ttft_ms"), 250 + 1575) && NEAR(cellv(&t, 10, "prefill_tps"), 250 / 1.825));
    CHECK(!strcmp(bt_cell(&t, 10, bt_find(&t, "profile"))->s, "250:16000"));
    bt_free(&t);

    /* speed with a small budget: rows that do not fit are notes, not rows */
    o.profile = "speed";
    o.output_len = 8;
    tg.max_tokens = 7000;
    CHECK(bench_run_profile(&tg, &o, &t, err, sizeof err) == 0);
    CHECK(t.n_rows == 2 && t.n_notes == 4, "speed rows %d notes %d", t.n_rows, t.n_notes);
    CHECK(cellv(&t, 1, "input_tokens") == 6144);
    double total = 6.144 + 0.02 * 7;
    CHECK(NEAR(cellv(&t, 1, "speed_tps"), (6144 + 8) / total) && NEAR(cellv(&t, 1, "total_s"), total));
    CHECK(NEAR(cellv(&t, 1, "memory_mb"), 64));
    CHECK(t.n_notes && strstr(t.notes[0], "skipped") && strstr(t.notes[0], "14336"), "%s", t.n_notes ? t.notes[0] : "");
    bt_free(&t);

    /* batch: MindIE figures */
    o.profile = "batch";
    o.output_len = 0;
    int ins[] = {1024}, bs[] = {1, 4};
    o.inputs = ins, o.n_inputs = 1, o.batches = bs, o.n_batches = 2;
    tg.max_tokens = 16384;
    CHECK(bench_run_profile(&tg, &o, &t, err, sizeof err) == 0);
    CHECK(t.n_rows == 2);
    /* batch 4: first token 4.096 s, then 1023 steps of 20 ms */
    CHECK(NEAR(cellv(&t, 1, "ttft_ms"), 4096) && NEAR(cellv(&t, 1, "tpot_ms"), 20));
    CHECK(NEAR(cellv(&t, 1, "total_s"), 4.096 + 0.02 * 1023));
    CHECK(NEAR(cellv(&t, 1, "decode_tps"), 200) && NEAR(cellv(&t, 1, "e2e_tps"), 4 * 1024 / (4.096 + 0.02 * 1023)));
    char *csv = to_string(&t, BT_CSV);
    const char *head = "Model,NChip,Batchsize,In_seq,Out_seq,Total time(s),Total time(s) min,";
    CHECK(strncmp(csv, head, strlen(head)) == 0, "%s", csv);
    free(csv);
    bt_free(&t);
    o.profile = "nope";
    CHECK(bench_run_profile(&tg, &o, &t, err, sizeof err) == -1 && strstr(err, "nope"));
}

static void test_plot(void) {
    const char *js = "{\"profile\": \"prefix\", \"meta\": {\"model\": \"m\", \"precision\": \"BF16\", \"backend\": \"CPU\"},"
                     "\"rows\": [{\"input_tokens\": 128, \"prefix_tokens\": 0, \"decode_tps\": 10, \"ttft_ms\": 50},"
                     "{\"input_tokens\": 2000, \"prefix_tokens\": 0, \"decode_tps\": 9, \"ttft_ms\": 900},"
                     "{\"input_tokens\": 500, \"prefix_tokens\": 250, \"decode_tps\": 9.5, \"ttft_ms\": 100}]}";
    const char *texts[2] = {js, js}, *labels[2] = {"a<b", "c"};
    char *buf = NULL, err[256];
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    CHECK(bench_plot_svg(texts, labels, 2, "t", m, err, sizeof err) == 0, "%s", err);
    fclose(m);
    CHECK(strstr(buf, "<svg") && strstr(buf, "</svg>") && strstr(buf, "a&lt;b, no prefix") && strstr(buf, "c, cached prefix"));
    int lines = 0;
    for (const char *p = buf; (p = strstr(p, "<polyline")); p++) lines++;
    CHECK(lines == 8, "polylines %d", lines); /* 4 series x 2 panels */
    free(buf);
    const char *empty[1] = {"{\"rows\": []}"};
    m = open_memstream(&buf, &len);
    CHECK(bench_plot_svg(empty, NULL, 1, "t", m, err, sizeof err) == -1);
    fclose(m);
    free(buf);
}

/* ---- tiny in-process runs on a fixture: rows and sane figures only ---- */

static void test_inproc(void) {
    char err[512] = "";
    struct kiln_engine_opts eo = {.model = FIXTURES "/qwen3-dense-small", .backend = "cpu", .n_threads = 1,
                                  .max_total_tokens = 1024, .prefill_chunk = 512};
    kiln_engine *e = kiln_engine_open(&eo, err, sizeof err);
    CHECK(e != NULL, "%s", err);
    if (!e) return;
    struct bench_target tg;
    bench_inproc_target(&tg, e, 1024, 512);
    struct bench_opts o;
    bench_opts_default(&o);
    o.reps = 2;
    o.output_len = 4;
    o.prefix_new = 40;
    int ins[] = {16, 100, 2000};
    o.inputs = ins, o.n_inputs = 3;
    struct bt_table t;
    CHECK(bench_run_profile(&tg, &o, &t, err, sizeof err) == 0, "%s", err);
    /* 16 and 100 without prefix, 100 = 60 cached + 40 new; 2000 does not fit 1024 (twice) */
    CHECK(t.n_rows == 3 && t.n_notes == 2, "rows %d notes %d", t.n_rows, t.n_notes);
    for (int r = 0; r < t.n_rows; r++) {
        CHECK(cellv(&t, r, "ttft_ms") > 0 && cellv(&t, r, "tpot_ms") > 0 && cellv(&t, r, "prefill_tps") > 0 &&
              cellv(&t, r, "decode_tps") > 0, "row %d", r);
        CHECK(cellv(&t, r, "measured_output") == 4);
    }
    CHECK(cellv(&t, 2, "prefix_tokens") == 60 && cellv(&t, 2, "prefill_len") == 40);
    bt_free(&t);

    o.profile = "batch";
    int bin[] = {8}, bs[] = {1, 3};
    o.inputs = bin, o.n_inputs = 1, o.batches = bs, o.n_batches = 2, o.output_len = 3;
    CHECK(bench_run_profile(&tg, &o, &t, err, sizeof err) == 0, "%s", err);
    CHECK(t.n_rows == 2 && cellv(&t, 1, "batch") == 3 && cellv(&t, 1, "output_tokens") == 3);
    CHECK(cellv(&t, 1, "total_s") > 0 && cellv(&t, 1, "decode_tps") > 0 && cellv(&t, 1, "e2e_tps") > 0);
    CHECK(cellv(&t, 1, "memory_mb") > 0);
    bt_free(&t);
    bench_inproc_free(&tg);

    /* a batch's prompts prefilled as many whole prompts per forward as fit
     * the chunk: 5 prompts of 40 in a chunk of 100 are 2 + 2 + 1, each
     * group's sequences getting their first token together, group after
     * group; prompts longer than the chunk go one after another */
    bench_inproc_target(&tg, e, 1024, 100);
    {
        double tf[5], te[5];
        int no[5];
        struct bench_job j = {.batch = 5, .n_new = 40, .n_out = 3, .seed = 7};
        struct bench_obs ob = {.t_first = tf, .t_end = te, .n_out = no};
        CHECK(tg.run(&tg, &j, &ob, err, sizeof err) == 0, "%s", err);
        CHECK(tf[0] == tf[1] && tf[2] == tf[3] && ob.t_send < tf[0] && tf[1] < tf[2] && tf[3] < tf[4] && tf[4] < te[0],
              "first tokens at %g %g %g %g %g after %g", tf[0], tf[1], tf[2], tf[3], tf[4], ob.t_send);
        for (int b = 0; b < 5; b++) CHECK(no[b] == 3 && te[b] == te[0], "sequence %d: %d tokens", b, no[b]);
        j.batch = 3, j.n_new = 150;
        CHECK(tg.run(&tg, &j, &ob, err, sizeof err) == 0, "%s", err);
        CHECK(ob.t_send < tf[0] && tf[0] < tf[1] && tf[1] < tf[2], "first tokens at %g %g %g", tf[0], tf[1], tf[2]);
    }
    bench_inproc_free(&tg);

    int pp[] = {32}, tgn[] = {4};
    struct bench_pptg_opts po = {.pp = pp, .n_pp = 1, .tg = tgn, .n_tg = 1, .reps = 2, .warmup = 1, .seed = 1,
                                 .size_str = "1 MiB", .params_str = "0.00 B"};
    snprintf(po.lab.model, sizeof po.lab.model, "small");
    CHECK(bench_pptg(e, &po, &t, err, sizeof err) == 0, "%s", err);
    CHECK(t.n_rows == 2);
    char *js = to_string(&t, BT_JSON);
    double pp32 = NAN, tg4 = NAN;
    for (int i = 0; i < t.n_summary; i++) {
        if (!strcmp(t.summary[i].k, "pp32")) pp32 = t.summary[i].v;
        if (!strcmp(t.summary[i].k, "tg4")) tg4 = t.summary[i].v;
    }
    CHECK(pp32 > 0 && tg4 > 0 && strstr(js, "\"pp32\": ") && strstr(js, "\"tg4\": "), "%s", js);
    CHECK(kiln_engine_decode_bytes(e) > 0 && kiln_engine_decode_bytes(e) <= (double)kiln_engine_param_bytes(e));
    {
        /* the probe reads with the kernels' load width: 16 on the scalar path, 32 AVX2, 64 AVX-512 */
        const int saved = cpu_isa();
        CHECK(cpu_set_isa(CPU_ISA_SCALAR) == CPU_ISA_SCALAR && kiln_engine_load_width(e) == 16, "%d", kiln_engine_load_width(e));
#if defined(KILN_X86)
        if (cpu_isa_max() >= CPU_ISA_AVX2) CHECK(cpu_set_isa(CPU_ISA_AVX2) == CPU_ISA_AVX2 && kiln_engine_load_width(e) == 32);
        if (cpu_isa_max() >= CPU_ISA_AVX512) CHECK(cpu_set_isa(CPU_ISA_AVX512) == CPU_ISA_AVX512 && kiln_engine_load_width(e) == 64);
#endif
        cpu_set_isa(saved);
    }
    {
        /* the bytes behind GB/s, per tensor: a tied GPTQ-int4 model reads all
         * of its bytes (BF16 embedding as lm_head, int4 layers); the untied
         * BF16 MoE fixture all but its embedding table and the 2 unused of
         * its experts' thirds per layer (3 x dim x moe_ffn x 2 bytes each) */
        struct kiln_engine_opts qo = {.model = FIXTURES "/quant/gptq-int4-g128-sym", .backend = "cpu", .max_total_tokens = 64};
        setenv("KILN_CPU_B12", "0", 1); /* the weights as stored; 12-bit BF16 below */
        kiln_engine *q = kiln_engine_open(&qo, err, sizeof err);
        CHECK(q != NULL, "%s", err);
        if (q) CHECK(kiln_engine_decode_bytes(q) == (double)kiln_engine_param_bytes(q), "%g vs %lld", kiln_engine_decode_bytes(q), (long long)kiln_engine_param_bytes(q));
        kiln_engine_close(q);
        unsetenv("KILN_CPU_B12");
#if defined(KILN_X86)
        /* with the BF16 lm_head (vocab x dim, dim a multiple of 64) in 12 bits, the head counts its rows of
         * 12-bit blocks plus 128 bytes per escaped block, in place of its 2 bytes per weight */
        q = kiln_engine_open(&qo, err, sizeof err);
        CHECK(q != NULL, "%s", err);
        if (q) {
            const struct kiln_config *c = kiln_engine_config(q);
            const double d = kiln_engine_decode_bytes(q), head = (double)c->vocab * (double)cpu_b12_row_bytes(c->dim);
            const double lo = (double)kiln_engine_param_bytes(q) - 2.0 * c->vocab * c->dim + head;
            CHECK(c->tie_embed && c->dim % 64 == 0 && d >= lo && d <= lo + 128.0 * c->vocab * c->dim / 64 && fmod(d - lo, 128) == 0,
                  "%g, the 12-bit head at %g + 128 per escape", d, lo);
        }
        kiln_engine_close(q);
#endif
        qo.model = FIXTURES "/qwen3-moe-tiny";
        setenv("KILN_CPU_B12", "0", 1);
        q = kiln_engine_open(&qo, err, sizeof err);
        unsetenv("KILN_CPU_B12");
        CHECK(q != NULL, "%s", err);
        if (q) {
            const struct kiln_config *c = kiln_engine_config(q);
            double skip = 2.0 * c->vocab * c->dim;
            for (int l = 0; l < c->n_layer; l++)
                if (c->layer_moe && c->layer_moe[l]) skip += 2.0 * 3 * c->dim * c->moe_ffn * (c->n_expert - c->n_expert_used);
            CHECK(!c->tie_embed && c->n_expert > c->n_expert_used && c->n_expert_used > 0);
            CHECK(fabs(kiln_engine_decode_bytes(q) - (kiln_engine_param_bytes(q) - skip)) < 1, "%g vs %g", kiln_engine_decode_bytes(q),
                  kiln_engine_param_bytes(q) - skip);
        }
        kiln_engine_close(q);
    }
    free(js);
    const double mem_plain = cellv(&t, 1, "peak_mem_mib");
    bt_free(&t);

    /* --roofline: the probe's figures, consistent with the row's GB/s, and
     * its 64 MiB buffer gone before the memory column is read */
    CHECK(bench_membw(2, 64 << 20, 2, 16) > 0.1 && bench_membw(2, 0, 2, 16) == -1);
    {
        /* one figure per pass, each pattern in turn; the result is their best */
        static const int streams[] = {1, 2, 4};
        double g[6] = {0}, mx = 0;
        const double best = bench_membw_passes(2, 32 << 20, 6, 16, streams, 3, g);
        for (int k = 0; k < 6; k++) mx = g[k] > mx ? g[k] : mx;
        CHECK(best > 0.1 && best == mx && g[0] > 0.1 && g[1] > 0.1 && g[5] > 0.1, "best %g of %g %g %g %g %g %g", best, g[0], g[1], g[2], g[3],
              g[4], g[5]);
        CHECK(bench_membw_passes(2, 32 << 20, 2, 16, streams, 0, NULL) == -1);
    }
    {
        /* the pairing: window w is held to the mean of the probes around it,
         * the repetition to the time-weighted mean of its windows */
        const double wt[2] = {1, 3}, pb[3] = {10, 20, 40};
        double mx = 0;
        CHECK(fabs(bench_roof_pair(wt, pb, 2, &mx) - (1 * 15 + 3 * 30) / 4.0) < 1e-12 && mx == 40, "%g max %g",
              bench_roof_pair(wt, pb, 2, NULL), mx);
        CHECK(fabs(bench_roof_pair(wt, pb, 1, &mx) - 15) < 1e-12 && mx == 20);
        CHECK(bench_roof_pair(wt, pb, 0, NULL) == -1);
    }
    /* tg4 in windows of 3 steps: two windows, three probes */
    po.roofline = 1, po.roofline_mib = 64, po.roofline_window = 3;
    CHECK(bench_pptg(e, &po, &t, err, sizeof err) == 0, "%s", err);
    const double bw = cellv(&t, 1, "membw_gbps"), roof = cellv(&t, 1, "roofline_pct"), gbps = cellv(&t, 1, "gbps");
    CHECK(bw > 0.1 && roof > 0 && isnan(cellv(&t, 0, "membw_gbps")), "membw %g roofline %g", bw, roof);
    /* the highest probe is at least the paired figure, so its share is at most the paired share */
    CHECK(summ(&t, "tg4_membw_max_gbps") >= bw - 1e-9 && summ(&t, "tg4_roofline_max_pct") <= roof + 1e-9 &&
              fabs(summ(&t, "tg4_roofline_pct") - roof) < 1e-9,
          "max %g GB/s %g%% vs %g %g%%", summ(&t, "tg4_membw_max_gbps"), summ(&t, "tg4_roofline_max_pct"), bw, roof);
    /* mean of per-repetition ratios against the ratio of means: the same within the repetitions' spread */
    CHECK(fabs(roof - 100 * gbps / bw) <= 0.5 * roof, "roofline %g%% vs %g / %g", roof, gbps, bw);
    CHECK(cellv(&t, 1, "peak_mem_mib") < mem_plain + 32, "peak %g MiB with the probe, %g without", cellv(&t, 1, "peak_mem_mib"), mem_plain);
    js = to_string(&t, BT_JSON);
    CHECK(strstr(js, "\"tg4_roofline_pct\": ") && strstr(js, "\"tg4_membw_gbps\": ") && strstr(js, "\"tg4_roofline_max_pct\": ") &&
              strstr(js, "\"tg4_membw_max_gbps\": "),
          "%s", js);
    free(js);
    bt_free(&t);

    /* --tg-batch 3: the tg row decodes 3 sequences together; t/s counts all
     * their tokens, GB/s the weights once per step */
    po.roofline = 0, po.tg_batch = 3;
    CHECK(bench_pptg(e, &po, &t, err, sizeof err) == 0, "%s", err);
    const struct bt_cell *lbl = t.n_rows == 2 ? bt_cell(&t, 1, bt_find(&t, "test")) : NULL;
    CHECK(lbl && lbl->s && !strcmp(lbl->s, "tg4 @ b3"), "%s", lbl && lbl->s ? lbl->s : "(none)");
    const double tg4b = summ(&t, "tg4_b3");
    CHECK(tg4b > 0 && isnan(summ(&t, "tg4")) && summ(&t, "pp32") > 0, "tg4_b3 %g", tg4b);
    CHECK(fabs(summ(&t, "tg4_b3_gbps") - kiln_engine_decode_bytes(e) * tg4b / 3 / 1e9) < 1e-6 * summ(&t, "tg4_b3_gbps"), "%g GB/s",
          summ(&t, "tg4_b3_gbps"));
    js = to_string(&t, BT_JSON);
    CHECK(strstr(js, "\"tg4_b3\": ") && strstr(js, "tg<n> @ b3"), "%s", js);
    free(js);
    bt_free(&t);
    kiln_engine_close(e);
}

void test_bench(void) {
    test_stats();
    test_tables();
    test_http();
    test_profiles_fake();
    test_plot();
    test_inproc();
}
