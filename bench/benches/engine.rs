//! Criterion benches of the engine on real memory pages (the test fixture):
//! the store's write and read paths against the bare codec on the same
//! pages, per codec, group size and mode, and memcpy of the same pages as
//! the physical limit. For whole-corpus ratios in one
//! process see `examples/engine_ratios.rs`.
//!
//! Run: `cargo bench -p zblk-bench --bench engine`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};
use zblk_bench::engine::{codec_ceiling, load_input};
use zblk_bench::fixture_path;

fn engine(c: &mut Criterion) {
    let data = load_input(&fixture_path()).expect("the fixture loads");
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(20);
    // The physical limit: copying the pages without compressing them.
    let mut dst = vec![1u8; data.len()];
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            for (d, s) in dst
                .chunks_exact_mut(PAGE_SIZE)
                .zip(data.chunks_exact(PAGE_SIZE))
            {
                d.copy_from_slice(std::hint::black_box(s));
            }
        })
    });
    for algo in [Algo::Lz4, Algo::Zstd(1), Algo::Zstd(3), Algo::Deflate(1)] {
        g.bench_function(BenchmarkId::new("codec_roundtrip", algo), |b| {
            b.iter(|| codec_ceiling(algo, &data).expect("codec runs"))
        });
        for (group, mode) in [(1, Mode::PerPage), (8, Mode::PerPage), (8, Mode::Packed)] {
            let mut cfg = StoreConfig::new(data.len() as u64);
            cfg.algo = algo;
            cfg.group_pages = group;
            cfg.mode = mode;
            let store = Store::new(cfg).expect("store");
            let mut ctx = store.new_ctx();
            let id = format!("{algo}/g{group}/{mode}");
            g.bench_function(BenchmarkId::new("store_write", &id), |b| {
                b.iter(|| {
                    for (i, req) in data.chunks(16 * PAGE_SIZE).enumerate() {
                        ctx.write((i * 16 * PAGE_SIZE) as u64, req).expect("write");
                    }
                })
            });
            let mut buf = vec![0u8; 16 * PAGE_SIZE];
            g.bench_function(BenchmarkId::new("store_read", &id), |b| {
                b.iter(|| {
                    for i in 0..data.len() / (16 * PAGE_SIZE) {
                        ctx.read((i * 16 * PAGE_SIZE) as u64, &mut buf)
                            .expect("read");
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, engine);
criterion_main!(benches);
