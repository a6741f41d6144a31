"""The per-batch figures DashInfer 1.3's EngineHelper printed (print_profiling_data), as a table."""
import math

COLUMNS = ("Batch_size", "Request_num", "Avg_in_tokens", "Avg_out_tokens", "Avg_context_time(s)",
           "Avg_generate_time(s)", "Avg_throughput(token/s)", "Throughput(token/s)", "QPS")


class ProfilingData:
    """Averages over the requests of one run (update per request, then update_df once); every
    update_df adds a row to `rows`, which show() prints."""

    def __init__(self, max_batch):
        self.rows = []
        self.reset(max_batch)

    def reset(self, max_batch):
        self.max_batch = max_batch
        self.batch_size = 0
        self.request_num = 0
        self.total_input_len = self.total_output_len = 0.0
        self.total_context_time = self.total_generate_time = 0.0
        self.avg_input_len = self.avg_output_len = 0.0
        self.avg_context_time = self.avg_generate_time = 0.0
        self.avg_throughput = self.total_throughput = 0.0
        self.total_time = 0.0
        self.qps = 0.0

    def update(self, in_len, out_len, ctx_time, gen_time):
        self.request_num += 1
        self.batch_size = min(self.request_num, self.max_batch)
        self.total_input_len += in_len or 0
        self.total_output_len += out_len or 0
        self.total_context_time += ctx_time or 0.0
        self.total_generate_time += gen_time or 0.0
        n = self.request_num
        self.avg_input_len = self.total_input_len / n
        self.avg_output_len = self.total_output_len / n
        self.avg_context_time = self.total_context_time / n
        self.avg_generate_time = self.total_generate_time / n
        # A request that ends at its first token has no generation time: no rate to report.
        self.avg_throughput = (self.avg_output_len / self.avg_generate_time
                               if self.avg_generate_time > 0 else math.nan)
        self.total_throughput = self.avg_throughput * self.batch_size

    def update_df(self, total_time):
        self.total_time = total_time
        if total_time > 0.0:
            self.qps = self.request_num / total_time
        else:
            self.qps = math.nan
            print("[Warning] total timecost is not set, cannot calculate QPS.")
        self.rows.append((self.batch_size, self.request_num, self.avg_input_len, self.avg_output_len,
                          self.avg_context_time, self.avg_generate_time, self.avg_throughput,
                          self.total_throughput, self.qps))

    def show(self):
        print(format_table(COLUMNS, self.rows))


def format_table(headers, rows):
    """A plain-text table (numbers with 3 decimals), psql-like as DashInfer's tabulate output."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"
    return "\n".join([rule, line(headers), rule, *map(line, cells), rule])
