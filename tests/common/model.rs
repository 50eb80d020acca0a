//! The model the engine's model-based tests check a store against: every
//! page's content, last access and idle mark, the operations all of them
//! draw (writes, reads, discards, clock steps, idle marking) and what
//! those do to the store and to the model. Each test adds its own
//! operations as `Op::Own` and applies them itself.

use super::{page, Content};
use proptest::prelude::*;
use zblk::{QueueCtx, Store, StoreStats, PAGE_SIZE, PAGE_SIZE_U64 as P};

/// The model clock moves in steps of this many seconds and idle ages sit
/// half a step off them: the real seconds a case takes (far fewer) cannot
/// move a page across an age.
pub const STEP: u64 = 100;

/// What the model knows of a stored page.
#[derive(Debug, Clone)]
pub struct Page {
    /// The content last written.
    pub data: Vec<u8>,
    /// Model clock at the last access, in steps.
    pub atime: u64,
    /// Whether the page carries an idle mark.
    pub idle: bool,
}

/// The device as the model sees it.
pub struct Model {
    /// Every page of the device; `None` reads as zeros.
    pub pages: Vec<Option<Page>>,
    /// The clock, in steps.
    pub now: u64,
    /// The device's writeback limit: pages left (`None`: off, as in a
    /// test that never sets one).
    pub limit: Option<u64>,
}

impl Model {
    /// A device of `pages` pages, none stored, at time 0, with no
    /// writeback limit.
    pub fn new(pages: u64) -> Self {
        Model {
            pages: vec![None; pages as usize],
            now: 0,
            limit: None,
        }
    }

    /// Pages stored (same-filled ones included).
    pub fn stored(&self) -> u64 {
        self.pages.iter().flatten().count() as u64
    }

    /// Pages with an idle mark.
    pub fn idle(&self) -> u64 {
        self.pages.iter().flatten().filter(|p| p.idle).count() as u64
    }

    /// Forgets `n` pages from `page` on, as a discard or write-zeroes does.
    pub fn clear(&mut self, page: u64, n: u64) {
        for s in &mut self.pages[page as usize..(page + n) as usize] {
            *s = None;
        }
    }
}

/// An operation of a model test: the ones every model test draws, and the
/// test's own (`X`), which [`apply`] hands back.
#[derive(Debug, Clone)]
pub enum Op<X> {
    /// Writes one page of each content from `page` on.
    Write { page: u64, contents: Vec<Content> },
    /// Reads `n` pages from `page` on, each checked against the model.
    Read { page: u64, n: u64 },
    /// Discards `n` pages from `page` on.
    Discard { page: u64, n: u64 },
    /// The clock moves `steps` steps forward.
    Tick { steps: u64 },
    /// Marks idle every page (`None`), or those not accessed for `steps`
    /// steps and a half.
    MarkIdle { steps: Option<u64> },
    /// One of the test's own operations.
    Own(X),
}

/// Any of the kinds of page content the store treats differently.
pub fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        Just(Content::Zeros),
        any::<u64>().prop_map(Content::SameWord),
        any::<u64>().prop_map(Content::Text),
        (0usize..96).prop_map(Content::Real),
        any::<u64>().prop_map(Content::Random),
    ]
}

/// A range of 1 to `max` pages that starts below `pages` and ends at the
/// latest at `pages`: (first page, pages).
pub fn range(pages: u64, max: u64) -> impl Strategy<Value = (u64, u64)> + Clone {
    (0..pages).prop_flat_map(move |p| (Just(p), 1..=(pages - p).min(max)))
}

/// A write of 1 to `max` pages inside a device of `pages` pages.
pub fn write<X: std::fmt::Debug + Clone>(pages: u64, max: u64) -> impl Strategy<Value = Op<X>> {
    (0..pages)
        .prop_flat_map(move |p| {
            (
                Just(p),
                prop::collection::vec(content(), 1..=((pages - p).min(max) as usize)),
            )
        })
        .prop_map(|(page, contents)| Op::Write { page, contents })
}

/// Applies one of the operations every model test draws to the store and
/// the model, checking what it reads against the model; hands a test's
/// own operation back untouched, for the test to apply.
pub fn apply<X>(
    store: &Store,
    ctx: &mut QueueCtx,
    m: &mut Model,
    op: Op<X>,
    real: &[u8],
) -> Result<Option<X>, TestCaseError> {
    match op {
        Op::Write { page: p, contents } => {
            let data: Vec<u8> = contents.iter().flat_map(|&c| page(c, real)).collect();
            ctx.write(p * P, &data).unwrap();
            for (i, pg) in data.chunks(PAGE_SIZE).enumerate() {
                m.pages[p as usize + i] = Some(Page {
                    data: pg.to_vec(),
                    atime: m.now,
                    idle: false,
                });
            }
        }
        Op::Read { page: p, n } => {
            let mut buf = vec![0xAAu8; (n * P) as usize];
            ctx.read(p * P, &mut buf).unwrap();
            for (i, got) in buf.chunks(PAGE_SIZE).enumerate() {
                match &mut m.pages[p as usize + i] {
                    Some(pg) => {
                        prop_assert!(got == &pg.data[..], "page {} differs", p as usize + i);
                        pg.atime = m.now;
                        pg.idle = false;
                    }
                    None => prop_assert!(got.iter().all(|&b| b == 0)),
                }
            }
        }
        Op::Discard { page: p, n } => {
            ctx.discard(p * P, n * P).unwrap();
            m.clear(p, n);
        }
        Op::Tick { steps } => {
            store.debug_advance_clock(steps * STEP);
            m.now += steps;
        }
        Op::MarkIdle { steps } => {
            let age = steps.map(|s| s * STEP + STEP / 2);
            let marked = store.mark_idle(age).unwrap();
            let mut want = 0;
            for pg in m.pages.iter_mut().flatten() {
                let old = steps.map_or(true, |s| m.now - pg.atime > s);
                if old && !pg.idle {
                    pg.idle = true;
                    want += 1;
                }
            }
            prop_assert_eq!(marked, want);
        }
        Op::Own(x) => return Ok(Some(x)),
    }
    Ok(None)
}

/// The gauges every model test can check: `idle_pages` and
/// `stored_pages` follow the model. Returns the statistics read, for the
/// test's own checks.
pub fn check_model_gauges(store: &Store, m: &Model) -> Result<StoreStats, TestCaseError> {
    let s = store.stats();
    prop_assert_eq!(
        s.counters.idle_pages,
        m.idle(),
        "idle_pages follows the model"
    );
    prop_assert_eq!(s.counters.stored_pages, m.stored());
    Ok(s)
}

/// Reads every page once, checked against the model. A read is an access:
/// it clears idle marks, so gauges are compared before it.
pub fn verify_all(ctx: &mut QueueCtx, m: &Model) -> Result<(), TestCaseError> {
    let mut buf = vec![0u8; PAGE_SIZE];
    for (p, want) in m.pages.iter().enumerate() {
        ctx.read(p as u64 * P, &mut buf).unwrap();
        match want {
            Some(pg) => prop_assert!(buf == pg.data, "page {p} differs"),
            None => prop_assert!(buf.iter().all(|&b| b == 0), "page {p} not zero"),
        }
    }
    Ok(())
}
