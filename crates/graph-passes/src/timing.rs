//! The event-driven timing evaluator shared by the stream pass's reports and exec-sim's timing model
//! (placeholder: the multi-stream scheduling issue fills it).
