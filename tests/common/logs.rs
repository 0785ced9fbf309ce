//! Capturing the log output of a test: every line the `fmt` subscriber writes, at `trace` level,
//! for checks of what is (and is never) logged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};

use tracing_subscriber::layer::SubscriberExt;

/// A `MakeWriter` collecting every log line.
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

/// Whether a capture is active (the global subscriber lets nothing through otherwise).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The active capture.
static SINK: Mutex<Option<CapturedLogs>> = Mutex::new(None);
/// One capture at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Ends the capture when dropped.
pub struct CaptureGuard {
    _one: MutexGuard<'static, ()>,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        ACTIVE.store(false, Ordering::Release);
        *SINK.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl CapturedLogs {
    /// Captures, at `trace` level, what every thread of the process logs (the sessions' own
    /// threads included) until the guard is dropped. The subscriber is the process's global one,
    /// installed at the first capture, and lets nothing through between captures.
    pub fn install() -> (Self, CaptureGuard) {
        static INIT: Once = Once::new();
        INIT.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(Router)
                .with_ansi(false)
                .finish()
                .with(tracing_subscriber::filter::dynamic_filter_fn(|_, _| {
                    ACTIVE.load(Ordering::Acquire)
                }));
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in the tests");
        });
        let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let logs = Self::default();
        *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(logs.clone());
        ACTIVE.store(true, Ordering::Release);
        (logs, CaptureGuard { _one: one })
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Writes to the active capture, if any.
#[derive(Clone, Copy)]
struct Router;

impl std::io::Write for Router {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(logs) = SINK.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            logs.write(buf)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Router {
    type Writer = Router;
    fn make_writer(&'a self) -> Router {
        *self
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
