import './base.css';
import './live.css';
